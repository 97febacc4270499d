"""The observed sink-rate / norm shape rule on synthetic heads (no model): a head that
falls and then flattens is not "interior", a convex head with a real rise is."""

import numpy as np
import pandas as pd
import pytest
import torch

from cwlens.sinks import observed
from cwlens.sinks.observed_shape import bin_means, critical_z, shape_of

N_HEADS, N_POINTS = 40, 2500


def _heads(f, noise: float = 0.15, seed: int = 0) -> pd.DataFrame:
    """Bins of ``N_HEADS`` synthetic heads ``y = f(r) + noise``, ``r`` uniform on [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    r = torch.rand(1, N_HEADS, N_POINTS, generator=g, dtype=torch.float64)
    y = f(r) + noise * torch.randn(1, N_HEADS, N_POINTS, generator=g, dtype=torch.float64)
    return observed.points_bins(r, y, torch.ones_like(r, dtype=torch.bool), ly=0)


def falling_then_flat(r):
    return 1 + 1.5 * (0.6 - r).clamp(min=0)


def test_monotone_heads_have_no_interior_minimum():
    """Falling-then-flat and strictly falling heads: 'falling', never 'interior' -- the
    quadratic fit over raw points calls nearly all of them interior."""
    for f in (falling_then_flat, lambda r: torch.exp(-3 * r) + 0.5):
        bins = _heads(f)
        fits = observed.head_fits(bins)
        assert (fits["shape"] == "falling").all(), fits["shape"].value_counts()
        s = observed.summary(bins)
        assert s["observed_interior_frac_heads"] == 0.0
        assert s["observed_falling_frac_heads"] == 1.0
    quad = observed.head_fits(_heads(falling_then_flat))
    assert (quad["quad_minimum"] == "interior").mean() > 0.9  # why the quadratic is no test


def test_convex_heads_with_a_real_rise_are_interior():
    bins = _heads(lambda r: 1 + 2 * (r - 0.5) ** 2)
    fits = observed.head_fits(bins)
    assert (fits["shape"] == "interior").all(), fits["shape"].value_counts()
    assert fits["min_rate"].between(0.35, 0.65).all()
    assert fits["rise"].gt(0).all() and fits["fall"].gt(0).all()
    assert observed.summary(bins)["observed_interior_frac_heads"] == 1.0


def test_rising_and_flat_heads():
    assert (observed.head_fits(_heads(lambda r: 1 + r))["shape"] == "rising").all()
    assert (observed.head_fits(_heads(lambda r: 1 + 0 * r))["shape"] == "flat").mean() >= 0.95


def test_a_shallow_rise_within_the_noise_is_not_interior():
    """A floor with a rise of 0.01 at the top (SE of a bin mean ~0.01): not resolved."""
    bins = _heads(lambda r: falling_then_flat(r) + 0.01 * (r > 0.9), noise=0.15)
    assert (observed.head_fits(bins)["shape"] != "interior").mean() >= 0.95


def test_bin_means_against_numpy():
    g = np.random.default_rng(1)
    r, y = g.uniform(size=300), g.normal(size=300) + 2
    bins = observed.points_bins(torch.tensor(r)[None, None], torch.tensor(y)[None, None],
                                torch.ones(1, 1, 300, dtype=torch.bool))
    got = bin_means(bins).set_index("bin")
    for b in range(10):
        sel = (np.floor(r * 10) == b)
        want = y[sel]
        assert got.loc[b, "mean"] == pytest.approx(want.mean(), rel=1e-10)
        assert got.loc[b, "se"] == pytest.approx(want.std(ddof=1) / np.sqrt(len(want)), rel=1e-8)
        assert got.loc[b, "high"] - got.loc[b, "mean"] == pytest.approx(1.959964 * got.loc[b, "se"], rel=1e-5)
        assert got.loc[b, "rate"] == pytest.approx(r[sel].mean(), rel=1e-10)


def test_rule_constants_and_few_bins():
    assert critical_z(10) == pytest.approx(3.69, abs=0.01)
    assert critical_z(10, 0.05) == pytest.approx(3.26, abs=0.01)
    tiny = bin_means(pd.DataFrame({"bin": [0, 1], "n": [50, 50], "s_r": [2.5, 7.5],
                                   "s_y": [50.0, 40.0], "s_y2": [51.0, 33.0]}))
    assert shape_of(tiny)["shape"] == "undetermined"


def test_pooled_bins_carry_intervals():
    pooled = observed.bin_summary(_heads(falling_then_flat), by_layer=False)
    assert (pooled["norm_rel_low"] < pooled["norm_rel"]).all()
    assert (pooled["norm_rel"] < pooled["norm_rel_high"]).all()
    assert "interior" not in set(observed.layer_fits(_heads(falling_then_flat))["shape"])
