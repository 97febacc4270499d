"""Attention-sink analysis (tables with pandas): statistics, anti-alignment, the sink-rate
sweep and sink-norm interventions. The math is in :mod:`cwlens.core.sinks`, the hooks in
:mod:`cwlens.engine.interventions.sinks`, the figures in :mod:`cwlens.plotting.sinks`.

The sink of each sequence is its first real token (with left padding, the first
position where ``attention_mask`` is 1).
"""

from cwlens.sinks.alignment import alignment_statistics, cosine_histograms, histogram_summary
from cwlens.sinks.norm_intervention import ppl_summary, sink_norm_intervention
from cwlens.sinks.statistics import head_summary, layer_summary, sink_statistics
from cwlens.sinks.sweep import curve_summary, sweep_statistics

__all__ = [
    "alignment_statistics",
    "cosine_histograms",
    "curve_summary",
    "head_summary",
    "histogram_summary",
    "layer_summary",
    "ppl_summary",
    "sink_norm_intervention",
    "sink_statistics",
    "sweep_statistics",
]
