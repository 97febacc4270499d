"""``cwlens analyze``: a self-contained HTML report of one text (a leaf layer)."""

from cwlens.report.analysis import TextAnalysis, analyze_text
from cwlens.report.html import render_report

__all__ = ["TextAnalysis", "analyze_text", "render_report"]
