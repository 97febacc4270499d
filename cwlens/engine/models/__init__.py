"""Model loading: short names, the offline GGUF default, local directories, hub ids."""

from cwlens.engine.models.loading import DEFAULT_MODEL, load_model
from cwlens.engine.models.registry import MODELS

__all__ = ["DEFAULT_MODEL", "MODELS", "load_model"]
