"""Simulate where :mod:`cwlens.core.bootstrap` holds: the coverage of its bootstrap-t
interval and the family-wise error of Holm's correction, on null samples of a chosen
size ``n`` and skewness.

A *population* is a distribution of per-sample values with mean 0 and variance 1 and a
known skewness ``gamma = E[x^3]`` (:data:`POPULATIONS`): the normal (``gamma = 0``),
centred gammas (``Gamma(k) - k) / sqrt(k)``, ``gamma = 2 / sqrt(k)``) and centred
lognormals (``gamma = (e^(s^2) + 2) sqrt(e^(s^2) - 1)``). A sample of ``n`` draws is one
test of ``mean = 0`` (true), e.g. the per-sample differences of two equally faithful
metrics; ``m`` samples are one family (one table's tests). Per population and ``n``
(:func:`simulate`):

- ``coverage``: the share of samples whose 95% interval contains the true mean 0;
- ``fwer``: per family size, the share of families where Holm's correction at 5%
  resolves any test (every one is null);
- ``type1``: the share of tests with ``p < 0.05`` uncorrected;

and the same for two alternatives measured on the same samples and the same
resamples: the BCa interval (:func:`cwlens.core.bootstrap.bca_ci`, its test by
inverting the interval) and a sign-flip permutation test of ``mean = 0``.

:func:`studentized_fast` is :func:`cwlens.core.bootstrap.studentized` (same seed, same
resamples) written as two matrix products over the resample counts ``W [B, n]``::

    m*_b - m = sum_i W_bi (x_i - m) / n,
    s*_b^2   = (sum_i W_bi (x_i - m)^2 - n (m*_b - m)^2) / (n (n - 1))

instead of gathering ``B x n`` values per sample: thousands of samples at n = 500 and
B = 2000 take seconds on one core (``tests/test_bootstrap_validity.py`` checks the two
agree). ``scripts/bootstrap_validity.py`` runs the grid and writes the table of
``docs/statistics.md``.
"""

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from cwlens.core.bootstrap import DEFAULT_BOOT, holm_reject, sample_skewness


@dataclass(frozen=True)
class Population:
    """Mean 0, variance 1, skewness ``skewness``: ``draw(rng, shape)``."""

    name: str
    skewness: float
    draw: Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


def _gamma(k: float) -> Population:
    return Population(f"gamma(k={k:g})", 2 / np.sqrt(k),
                      lambda rng, shape: (rng.gamma(k, 1.0, shape) - k) / np.sqrt(k))


def _lognormal(s: float) -> Population:
    e = np.exp(s * s)
    mean, sd = np.exp(s * s / 2), np.sqrt((e - 1) * e)
    return Population(f"lognormal(s={s:g})", float((e + 2) * np.sqrt(e - 1)),
                      lambda rng, shape: (np.exp(s * rng.standard_normal(shape)) - mean) / sd)


def gamma_with_skewness(skewness: float) -> Population:
    """The centred gamma of skewness ``skewness`` (> 0): shape ``k = 4 / skewness^2``."""
    return _gamma(4 / skewness**2)


NORMAL = Population("normal", 0.0, lambda rng, shape: rng.standard_normal(shape))
# the grid of the documented table: skewness 0 .. 4 by gammas, two lognormals beside them
# (lognormal(s=1), skewness 6.18: the case the issue found at 0.888 / 0.903 coverage)
POPULATIONS = (NORMAL, *(gamma_with_skewness(g) for g in (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)),
               _lognormal(0.5), _lognormal(1.0))


def resample_counts(n: int, n_boot: int = DEFAULT_BOOT, seed: int = 0) -> np.ndarray:
    """``W [B, n]``: how often each sample is drawn in each resample, from the indices
    :func:`~cwlens.core.bootstrap.studentized` draws with the same ``seed``."""
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    counts = np.zeros((n_boot, n))
    np.add.at(counts, (np.repeat(np.arange(n_boot), n), idx.reshape(-1)), 1.0)
    return counts


def _t_squared(x: np.ndarray, counts: np.ndarray):
    """``(m, s, t*^2 [rows, B], resampled mean - m [rows, B])`` of samples ``x [rows, n]``
    (``t*^2`` NaN where a resample has no spread)."""
    n = x.shape[-1]
    m = x.mean(-1)
    xc = x - m[:, None]
    sq = xc * xc
    ss = sq.sum(-1)
    s = np.sqrt(ss / (n - 1) / n)
    dm = xc @ counts.T
    dm /= n
    var = sq @ counts.T  # sum_i W_bi (x_i - m)^2, then minus n (m*_b - m)^2
    t2 = dm * dm
    var -= n * t2
    t2 *= n * (n - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t2 /= var
    t2[:, counts.max(-1) == n] = np.nan  # every draw the same sample (continuous draws: same value)
    return m, s, t2, dm


def studentized_fast(x: np.ndarray, counts: np.ndarray, level: float = 0.95):
    """``(mean, low, high, p)`` of :func:`~cwlens.core.bootstrap.studentized` for samples
    ``x [rows, n]`` and the resample counts of its seed (:func:`resample_counts`)."""
    m, s, t2, _ = _t_squared(x, counts)
    t = np.sqrt(t2)
    q = np.nanquantile(t, level, axis=-1)
    t0 = np.abs(m / s)
    p = (1 + (t >= t0[:, None]).sum(-1)) / (1 + np.isfinite(t).sum(-1))
    return m, m - q * s, m + q * s, p


def null_tests(x: np.ndarray, counts: np.ndarray, level: float = 0.95):
    """``(covered, p, resampled mean - mean)``: whether the bootstrap-t interval of each
    sample of ``x [rows, n]`` contains 0, and its p-value of ``mean = 0`` -- the
    decisions of :func:`studentized_fast`, from one count per sample: with ``c`` resamples
    of ``|t*| < |t0|`` among ``B``, ``p = (1 + B - c) / (1 + B)``, and 0 lies in the
    interval iff ``|t0| <=`` the ``level`` quantile of ``|t*|`` (``np.quantile``'s linear
    rule between the order statistics ``k = floor((B - 1) level)`` and ``k + 1``): iff
    ``c <= k``, or ``c = k + 1`` and ``|t0|`` is within the interpolation."""
    m, s, t2, dm = _t_squared(x, counts)
    t02 = (m / s) ** 2
    below = (t2 < t02[:, None]).sum(-1)
    finite = np.isfinite(t2).sum(-1) if np.isnan(t2).any() else np.full(len(x), t2.shape[-1])
    p = (1 + finite - below) / (1 + finite)
    h = (finite - 1) * level
    k = np.floor(h).astype(int)
    covered = below <= k
    edge = np.flatnonzero(below == k + 1)
    for i in edge:  # the rare sample between two order statistics: interpolate as np.quantile
        q = np.nanquantile(np.sqrt(t2[i]), level)
        covered[i] = np.sqrt(t02[i]) <= q
    return covered, p, dm


_NORMAL = NormalDist()
_inv_u = np.frompyfunc(_NORMAL.inv_cdf, 1, 1)
_cdf_u = np.frompyfunc(_NORMAL.cdf, 1, 1)


def _inv(p: np.ndarray) -> np.ndarray:
    return np.asarray(_inv_u(p), dtype=float)


def _cdf(z: np.ndarray) -> np.ndarray:
    return np.asarray(_cdf_u(z), dtype=float)


def bca_pvalue(x: np.ndarray, dm: np.ndarray) -> np.ndarray:
    """Two-sided p-value of ``mean = 0`` by inverting :func:`~cwlens.core.bootstrap.bca_ci`
    (the largest ``1 - level`` whose BCa interval still contains 0), from the resampled
    means ``mean + dm`` of samples ``x [rows, n]``: ``u`` = the share of resampled means
    below 0 maps through ``z0`` and ``a`` to ``z``, ``p = 2 min(Phi(z), 1 - Phi(z))``."""
    b = dm.shape[-1]
    m = x.mean(-1)

    def share(below: np.ndarray) -> np.ndarray:
        return np.clip(below, 1 / (b + 1), b / (b + 1))

    z0 = _inv(share(((dm < 0).sum(-1) + 0.5 * (dm == 0).sum(-1)) / b))
    dev = x - m[:, None]
    a = (dev**3).sum(-1) / (6 * ((dev**2).sum(-1)) ** 1.5)
    u = share((dm < -m[:, None]).sum(-1) / b)  # where 0 falls among the resampled means
    w = _inv(u) - z0
    ok = 1 + a * w > 0  # else no level's interval reaches 0 (the map's range ends before u)
    z = np.where(ok, w / np.where(ok, 1 + a * w, 1.0) - z0, np.inf)
    phi = _cdf(z)
    return 2 * np.minimum(phi, 1 - phi)


def signflip_pvalue(x: np.ndarray, n_flip: int = DEFAULT_BOOT, seed: int = 0) -> np.ndarray:
    """``(1 + #{|mean of e_i x_i| >= |mean|}) / (1 + F)`` over ``F`` random sign vectors
    ``e``: exact when the per-sample differences are symmetric about 0 (two exchangeable
    metrics), not guaranteed when they are skewed with mean 0."""
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(n_flip, x.shape[-1]))
    flipped = np.abs(x @ signs.T)
    return (1 + (flipped >= np.abs(x.sum(-1))[:, None] - 1e-12).sum(-1)) / (1 + n_flip)


@dataclass(frozen=True)
class CellResult:
    """One (population, n) cell of the simulation: per sample whether its interval
    covers 0 (``covered``), its p-values (``p``: bootstrap-t; ``p_bca``; ``p_signflip``)
    and its sample skewness; samples are ``[families, m]``."""

    covered: np.ndarray
    p: np.ndarray
    p_bca: np.ndarray
    p_signflip: np.ndarray
    skewness: np.ndarray


def simulate(population: Population, n: int, families: int, m: int = 30, n_boot: int = 2000,
             seed: int = 0, level: float = 0.95, chunk: int = 2500) -> CellResult:
    """``families x m`` null samples of size ``n`` from ``population``, each tested as
    :func:`~cwlens.core.bootstrap.paired_bootstrap` tests it (``seed``: its resampling
    seed, 0 as the tables use; the data come from ``seed``, the population and ``n``)."""
    rng = np.random.default_rng([seed, n, zlib.crc32(population.name.encode())])
    x = population.draw(rng, (families * m, n))
    counts = resample_counts(n, n_boot, seed)
    covered, p, p_bca, p_flip = (np.empty(len(x)) for _ in range(4))
    for start in range(0, len(x), chunk):
        part = slice(start, start + chunk)
        covered[part], p[part], dm = null_tests(x[part], counts, level)
        p_bca[part] = bca_pvalue(x[part], dm)
        p_flip[part] = signflip_pvalue(x[part], n_boot, seed + 1)
    shape = (families, m)
    return CellResult(covered.reshape(shape).astype(bool), p.reshape(shape), p_bca.reshape(shape),
                      p_flip.reshape(shape), sample_skewness(x).reshape(shape))


def family_error(p: np.ndarray, size: int, alpha: float = 0.05,
                 counted: np.ndarray | None = None) -> float:
    """The share of families of ``size`` tests (consecutive columns of ``p [families,
    m]``, ``m // size`` families per row) where Holm's correction at ``alpha`` rejects
    any test; ``counted``: only rejections of these tests count (e.g. the unflagged)."""
    k = p.shape[-1] // size
    groups = p[:, : k * size].reshape(-1, size)
    reject = holm_reject(groups, alpha)
    if counted is not None:
        reject &= counted[:, : k * size].reshape(-1, size)
    return float(reject.any(-1).mean())
