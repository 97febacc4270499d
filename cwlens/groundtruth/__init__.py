"""Ground truth: compiled transformers whose computation is known (tracr), as cwlens models.

- :func:`load` / :func:`names`: the shipped programs (no jax needed); :func:`from_file`:
  a RASP program file of your own (needs the tracr extra). Each is a
  :class:`CompiledProgram`: its ``model``, its inputs (``sample_inputs``) and their
  :class:`Truth` (``truth``), its ``components``.
- :func:`from_tracr`: tracr's assembled model -> a model every cwlens function measures.
- :func:`encode` / :func:`decode`: token ids of an input, tracr's decoded outputs;
  :func:`written`: where the program wrote an output at all.
- :func:`edge_effects`: the exact effect of removing each attention edge of any model at
  one query (the per-edge truth, docs/edge_truth.md); :class:`EdgeEffects` scores a
  method's weights against it.

See docs/groundtruth.md. Importing this package imports neither jax nor tracr.
"""

from cwlens.engine.models.tracr_network import TracrTransformer
from cwlens.groundtruth.codec import decode, encode, written
from cwlens.groundtruth.convert import TracrLayout, from_tracr, load_weights, save
from cwlens.groundtruth.edge_methods import method_weights
from cwlens.groundtruth.edges import EdgeEffects, edge_effects, joint_effects
from cwlens.groundtruth.library import CompiledProgram, from_file, load, names
from cwlens.groundtruth.truth import Truth

__all__ = ["CompiledProgram", "EdgeEffects", "TracrLayout", "TracrTransformer", "Truth", "decode",
           "edge_effects", "encode", "from_file", "from_tracr", "joint_effects", "load", "load_weights",
           "method_weights", "names", "save", "written"]
