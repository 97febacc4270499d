"""Summaries that sum with pandas never turn a NaN into a number (#39.2, held-out round 7)."""

import math

import pandas as pd

from cwlens.sinks.norm_intervention import ppl_summary


def test_ppl_summary_keeps_a_nan_nll():
    ppl = pd.DataFrame({"sample": [0, 1, 0, 1], "target": ["clean", "clean", "sink", "sink"],
                        "scale": [1.0, 1.0, 0.0, 0.0], "nll_sum": [4.0, 6.0, float("nan"), 7.0],
                        "n_tokens": [2, 3, 2, 3]})
    out = ppl_summary(ppl).set_index("target")
    assert math.isclose(out.loc["clean", "ppl"], math.exp(10 / 5))
    for col in ("nll_sum", "ppl", "delta_ppl", "mean_sample_delta_ppl"):
        assert math.isnan(out.loc["sink", col]), (col, out)  # pandas' sum gave ppl exp(7/5)


def test_aopc_keeps_a_nan_damage():
    from cwlens.faithfulness.aopc import aopc

    damage = pd.DataFrame({"metric": "contribution", "mode": "comprehensiveness",
                           "sample_id": ["a", "a", "b", "b"], "rate": [0.1, 0.2, 0.1, 0.2],
                           "damage": [1.0, float("nan"), 2.0, 4.0], "layers": "all"})
    out = aopc(damage).set_index("sample_id")
    assert math.isnan(out.loc["a", "aopc"]) and math.isnan(out.loc["a", "score"])  # was 1.0
    assert out.loc["b", "aopc"] == 3.0 and out.loc["b", "score"] == 3.0
