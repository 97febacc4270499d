"""Ground truth: compiled transformers whose computation is known (tracr), as cwlens models.

- :func:`from_tracr`: tracr's assembled model -> a model every cwlens function measures.
- :func:`encode` / :func:`decode`: token ids of an input, tracr's decoded outputs.
"""

from cwlens.groundtruth.codec import decode, encode
from cwlens.groundtruth.convert import TracrLayout, from_tracr, load_weights, save
from cwlens.groundtruth.network import TracrTransformer

__all__ = ["TracrLayout", "TracrTransformer", "decode", "encode", "from_tracr", "load_weights", "save"]
