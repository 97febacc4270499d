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
