"""The BCa interval of the perturbation-curve bands: bounded where bootstrap-t explodes,
close to scipy's BCa, and about nominal coverage on normal data."""

import numpy as np
import pytest

from cwlens.core.bootstrap import bca_ci, bootstrap_ci


def sparse(seed=0, n=64):
    """A rate that masks nothing in most short rows: float noise (MiniLM's 1 - cos of an
    unchanged embedding is ~6e-8) and two real damages of ~0.1-0.2."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 6e-8, n)
    x[rng.choice(n, 2, replace=False)] = rng.uniform(0.1, 0.2, 2)
    return x


def test_mostly_zero_damages_give_a_bounded_band():
    x = sparse()
    lo, hi = bca_ci(x)
    assert 0 <= lo <= x.mean() <= hi <= x.max()
    t_lo, t_hi = bootstrap_ci(x)  # the reason for BCa here: bootstrap-t's band is far wider
    assert t_hi - t_lo > 100 * (hi - lo)


def test_equal_values_and_tiny_samples():
    assert bca_ci([0.5] * 10) == (0.5, 0.5)
    assert all(np.isnan(bca_ci([1.0])))


def test_close_to_scipy_bca():
    stats = pytest.importorskip("scipy.stats")
    x = np.random.default_rng(3).lognormal(size=30)
    lo, hi = bca_ci(x, n_boot=20000)
    ref = stats.bootstrap((x,), np.mean, n_resamples=20000, method="BCa", random_state=1).confidence_interval
    assert lo == pytest.approx(ref.low, rel=0.03) and hi == pytest.approx(ref.high, rel=0.03)


def test_coverage_on_normal_data_is_near_nominal():
    rng = np.random.default_rng(0)
    hits = [lo <= 0 <= hi for lo, hi in (bca_ci(rng.normal(size=24), n_boot=999, seed=k)
                                         for k in range(400))]
    assert 0.90 <= np.mean(hits) <= 0.99
