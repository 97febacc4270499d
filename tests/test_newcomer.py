"""What a new user tripped on (issue 48, section 3): one test per point where one can be
written, each failing on the code before its fix (605cdc9)."""

import numpy as np
import pandas as pd
import pytest

# --- 5. a perplexity interval below zero; the hierarchy naming a pair twice -------------

FOUR_PPLS = (6.1, 7.4, 9.0, 64.0)  # four texts, one far off: skewed, as a real 4-text run


def _clean_rows(values, measure="ppl"):
    return pd.DataFrame([{"model": "m", "dataset": "toy", "metric": "none", "mode": "clean",
                          "rate": 0.0, "layers": "none", "scope": "row", "sample_id": f"s{i}",
                          "measure": measure, "value": float(v)} for i, v in enumerate(values)])


def test_the_interval_of_a_perplexity_stays_above_zero():
    """A 4-text run printed ``clean ppl: 21.56 [-302.43, 345.56]``: the plain bootstrap-t
    of a few skewed perplexities reaches below zero; on the log scale it cannot."""
    from cwlens.core.bootstrap import bootstrap_ci, positive_ci
    from cwlens.faithfulness.results import summarize

    low, _ = bootstrap_ci(FOUR_PPLS)
    assert low < 0  # the plain interval: what was printed
    row = summarize(_clean_rows(FOUR_PPLS)).iloc[0]
    assert 0 < row["ci_low"] <= row["mean"] <= row["ci_high"]
    assert (row["ci_low"], row["ci_high"]) == positive_ci(FOUR_PPLS)
    # nll is positive too; a signed measure keeps the plain interval
    assert summarize(_clean_rows(np.log(FOUR_PPLS), "nll")).iloc[0]["ci_low"] > 0
    delta = summarize(_clean_rows(np.array(FOUR_PPLS) - 10, "delta_ppl")).iloc[0]
    assert (delta["ci_low"], delta["ci_high"]) == pytest.approx(bootstrap_ci(np.array(FOUR_PPLS) - 10))


def test_positive_interval_edge_cases():
    from cwlens.core.bootstrap import positive_ci

    assert positive_ci([3.0, 3.0, 3.0]) == (3.0, 3.0)
    assert all(np.isnan(positive_ci([1.0, 2.0])))
    # on well-behaved data it is close to the plain interval
    from cwlens.core.bootstrap import bootstrap_ci

    x = np.random.default_rng(0).normal(50, 2, 200)
    assert positive_ci(x) == pytest.approx(bootstrap_ci(x), rel=1e-3)


def test_a_flagged_unresolved_pair_is_named_once():
    """Four samples, two metrics: the hierarchy line read ``attn ≈ contrib: unresolved
    (attn vs contrib) († attn vs contrib)``."""
    from cwlens.faithfulness.report import hierarchy_verdict

    rng = np.random.default_rng(1)
    rows = [{"dataset": "toy", "metric": metric, "mode": "comprehensiveness", "rate": 0.3,
             "scope": "row", "layers": "all", "sample_id": f"s{i}", "measure": "delta_ppl",
             "value": float(v)}
            for metric in ("attention", "contribution") for i, v in enumerate(rng.normal(10, 5, 4))]
    verdict = hierarchy_verdict(pd.DataFrame(rows), "toy", "comprehensiveness", 0.3, "delta_ppl")
    assert verdict.count("attn vs contrib") == 1, verdict
    assert verdict.endswith("unresolved (attn vs contrib†)"), verdict
