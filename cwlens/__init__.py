"""cwlens: contribution weights for TransformerLens models.

The public names are imported lazily, so ``import cwlens`` is cheap and imports neither
transformer_lens nor plotly; ``cwlens.core`` is the pure-torch math.
"""

__version__ = "0.1.0"

_PUBLIC = {
    "contribution_weights": "cwlens.measures",
    "token_contributions": "cwlens.measures",
    "importance": "cwlens.measures",
    "decompose": "cwlens.measures",
    "Decomposition": "cwlens.measures",
    "closure": "cwlens.measures",
    "Closure": "cwlens.measures",
    "names_filter": "cwlens.measures",
    "run_with_cache": "cwlens.measures",
    "load_model": "cwlens.models",
    "wrap": "cwlens.handle",
    "stream": "cwlens.streaming",
    "stream_geometry": "cwlens.streaming",
    "stream_reduce": "cwlens.streaming",
    "StreamResult": "cwlens.streaming",
    "AttentionGeometry": "cwlens.core",
}

__all__ = sorted(_PUBLIC) + ["__version__", "reducers"]


def __getattr__(name: str):
    import importlib

    if name == "reducers":
        return importlib.import_module("cwlens.reducers")
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'cwlens' has no attribute {name!r}")


def __dir__():
    return __all__
