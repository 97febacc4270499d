"""Model loading: short names, the offline GGUF default, local directories, hub ids."""

from cwlens.models.loading import DEFAULT_MODEL, load_model
from cwlens.models.registry import MODELS

__all__ = ["DEFAULT_MODEL", "MODELS", "load_model"]
