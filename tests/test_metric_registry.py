"""One registry (cwlens.core.metrics) feeds every list of metrics: a metric added there is
known to the measures, the stream, the rankings, the report, the figures and the CLI."""

import pytest

from cwlens.core import metrics
from cwlens.core._types import METRICS, STREAM_METRICS
from cwlens.errors import UnknownOptionError


def test_every_list_reads_the_registry():
    from cwlens.cli.faithfulness import _metrics_help
    from cwlens.faithfulness.ranking import ALL_RANKINGS, RANKINGS
    from cwlens.faithfulness.report import HIERARCHY, SHORT
    from cwlens.plotting.faithfulness import COLORS, LABELS

    assert METRICS == HIERARCHY == ("attention", "value_weighted",
                                    "value_weighted_output_normalized", "contribution")
    assert set(STREAM_METRICS) == {n for n, m in metrics.REGISTRY.items() if m.source == "geometry"}
    assert {"alti", "contribution_abs"} <= set(STREAM_METRICS)
    assert RANKINGS == METRICS + ("contribution_abs", "random")  # the default sweep, unchanged
    assert set(ALL_RANKINGS) == set(metrics.REGISTRY) == set(SHORT) == set(COLORS) == set(LABELS)
    assert all(name in _metrics_help() for name in metrics.NAMES)
    assert all(metrics.REGISTRY[n].supervised for n in metrics.GRADIENT)
    assert all("sup." in SHORT[n] for n in metrics.GRADIENT)  # tables say it


def test_unknown_and_misplaced_metrics_explain_themselves():
    from cwlens.engine.streaming import check_metric

    with pytest.raises(UnknownOptionError, match="Valid metrics"):
        check_metric("contrib")
    with pytest.raises(UnknownOptionError, match="backward pass"):
        check_metric("attention_gradient")
    assert check_metric("alti") == "alti"
