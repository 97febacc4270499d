"""Pure math: tensors in, tensors out. Imports neither transformer_lens, plotly nor pandas."""

from cwlens.core.geometry import AttentionGeometry, safe_divide

__all__ = ["AttentionGeometry", "safe_divide"]
