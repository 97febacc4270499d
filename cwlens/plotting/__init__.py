"""Plotly figures (a leaf layer: nothing else in cwlens imports it). plotly is imported lazily."""

from cwlens.plotting.export import find_chrome, save_figure
from cwlens.plotting.heatmaps import attention_vs_contribution

__all__ = ["attention_vs_contribution", "find_chrome", "save_figure"]
