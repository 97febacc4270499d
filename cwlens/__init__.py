"""cwlens: contribution weights for TransformerLens models.

The public names are imported lazily, so ``import cwlens`` is cheap and imports neither
transformer_lens nor plotly; ``cwlens.core`` is the pure-torch math.
"""

import importlib

__version__ = "0.1.0"

_PUBLIC = {
    "contribution_weights": "cwlens.engine.measures",
    "token_contributions": "cwlens.engine.measures",
    "importance": "cwlens.engine.measures",
    "decompose": "cwlens.engine.measures",
    "Decomposition": "cwlens.engine.measures",
    "closure": "cwlens.engine.measures",
    "Closure": "cwlens.engine.measures",
    "names_filter": "cwlens.engine.measures",
    "run_with_cache": "cwlens.engine.measures",
    "attention_mask_of": "cwlens.engine.measures",
    "load_model": "cwlens.engine.models",
    "wrap": "cwlens.engine.handle",
    "stream": "cwlens.engine.streaming",
    "stream_geometry": "cwlens.engine.streaming",
    "stream_reduce": "cwlens.engine.streaming",
    "StreamResult": "cwlens.engine.streaming",
    "AttentionGeometry": "cwlens.core",
    "graph": "cwlens.graphs.build",
    "ContributionGraph": "cwlens.graphs.result",
}

__all__ = sorted(_PUBLIC) + ["__version__", "reducers"]


def __getattr__(name: str):
    if name == "reducers":
        return importlib.import_module("cwlens.engine.reducers")
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'cwlens' has no attribute {name!r}")


def __dir__():
    return __all__
