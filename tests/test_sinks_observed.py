"""The observed sink-rate / norm relation: sums, fits and bins against direct computation."""

import numpy as np
import pandas as pd
import pytest
import torch

import cwlens
from cwlens.core.sinks import SinkGeometry, first_real_index
from cwlens.engine import adapter
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.sinks import observed
from cwlens.testing import tiny_model

TEXTS = ["the cat sat on the mat", "mary gave john a bottle of milk when they went to the store .",
         "paris is the capital of france"]


@pytest.fixture(scope="module")
def run():
    model = tiny_model("llama")
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
    return model, mask, cache


def _points(model, cache, mask, layer, head):
    geo = adapter.geometry(cache, wrap(model), layer, mask)
    sg = SinkGeometry(geo, first_real_index(mask.bool()))
    r, y, ok = observed.layer_points(sg)
    return r[:, head][ok[:, head]].double().numpy(), y[:, head][ok[:, head]].double().numpy()


def test_head_fit_equals_numpy_polyfit(run):
    model, mask, cache = run
    bins = observed.observed_bins(cache, model, mask)
    fits = observed.head_fits(bins).set_index(["layer", "head"])
    for layer, head in [(0, 1), (1, 3)]:
        r, y = _points(model, cache, mask, layer, head)
        c2, c1, c0 = np.polyfit(r, y, 2)
        got = fits.loc[(layer, head)]
        assert got["n"] == len(r)  # real queries after the sink only
        np.testing.assert_allclose([got.c0, got.c1, got.c2], [c0, c1, c2], rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(got["corr"], np.corrcoef(r, y)[0, 1], rtol=1e-8)
        assert got["r_min"] == pytest.approx(r.min()) and got["r_max"] == pytest.approx(r.max())


def test_bins_add_over_batches(run):
    model, mask, cache = run
    whole = observed.combine_bins(observed.observed_bins(cache, model, mask))
    parts = []
    for rows in ([0], [1, 2]):
        tokens, m = pad_batch(model, [TEXTS[i] for i in rows])
        with torch.no_grad():
            _, c = cwlens.run_with_cache(model, tokens, attention_mask=m)
        parts.append(observed.observed_bins(c, model, m))
    split = observed.combine_bins(pd.concat(parts))
    pd.testing.assert_frame_equal(whole, split, rtol=1e-5, check_dtype=False)


def test_interior_minimum_is_found():
    """A constructed head with y = (r - 0.4)^2 + 1: interior minimum at 0.4."""
    r = torch.linspace(0.05, 0.95, 50)
    y = (r - 0.4) ** 2 + 1
    sums, lo, hi = observed._bin_sums(r[None, None], y[None, None], torch.ones(1, 1, 50, dtype=torch.bool), 10)
    s = dict(zip(observed.SUMS, sums[0].sum(0).tolist(), strict=True))
    fit = observed._fit(s, float(r.min()), float(r.max()))
    assert fit["minimum"] == "interior" and fit["r_star"] == pytest.approx(0.4, abs=1e-6)
    fit = observed._fit({k: v for k, v in s.items()}, 0.5, 0.95)  # range right of r*
    assert fit["minimum"] in ("low", "interior")


def test_summary_and_line(run):
    model, mask, cache = run
    bins = observed.observed_bins(cache, model, mask)
    s = observed.summary(bins, sink_heads={(0, 0)})
    assert 0 <= s["observed_interior_frac_heads"] <= 1
    assert "observed ||o^h|| vs own sink rate" in observed.format_line(s)
    pooled = observed.bin_summary(bins, by_layer=False)
    assert pooled["n"].sum() == bins["n"].sum()
