"""Seeded studentized (bootstrap-t) intervals of a mean and of a paired mean difference,
and the Holm correction of a family of paired tests.

For samples ``x_1..x_n`` with mean ``m`` and standard error ``s = sd(x) / sqrt(n)`` the
bootstrap draws ``B`` resamples of size ``n`` with replacement and studentizes each:
``t*_b = (m*_b - m) / s*_b``. The symmetric bootstrap-t interval is::

    m -/+ q * s,     q = the ``level`` quantile of |t*|

and the two-sided p-value of ``mean = 0`` is the Monte Carlo ``p = (1 + #{|t*| >= |m /
s|}) / (1 + B)``, so ``p < 1 - level`` about when the interval excludes 0 (``p`` is never
below ``1 / (1 + B)``: with ``B = 1999``, Holm over 30 tests can still reject; over more
than ``(1 - level) (1 + B)`` = 100 tests, never). Unlike the percentile interval (the
quantiles of ``m*``), it does not shrink with the sample's own spread at small ``n``: on
normal data at nominal 95% the percentile interval covers 88% at n = 8 and 93% at n = 24,
the bootstrap-t 95% at both (``tests/test_bootstrap_null.py`` simulates it). Resamples
whose draws are all equal (``s* = 0``, or ~1e-17 from round-off in their mean) are left
out; a sample with ``s = 0`` has the interval ``[m, m]`` (p = 0 unless ``m = 0``).

Paired comparisons (two metrics scored on the same samples) resample *samples*, not
values: the per-sample differences ``d_k = b_k - a_k`` carry the pairing. A difference
is *resolved* when its interval excludes 0 -- or, in a family of tests (the cells of one
table, the layers of a per-layer run), when Holm's step-down procedure rejects it at
``1 - level`` (:func:`holm`). Holm keeps the chance of any false "resolved" in the family
at most ``1 - level`` when every p-value is valid, ``P(p <= u) <= u`` down to ``u = (1 -
level) / m``.

Where that holds (``scripts/bootstrap_validity.py``, ``docs/statistics.md``): for the
per-sample values' skewness, not for any data. On simulated null samples with B = 2000 the
95% interval covers 0.944-0.961 and Holm's family-wise error over 4 and 30 tests stays
within 0.05 (+ Monte Carlo error) for normal values at n = 8 to 500, and for skewness up to
0.5 at n >= 8, 1 at n >= 50, 1.5 at n >= 100, 2 at n >= 200, 4 at n = 500. Beyond, it
does not: lognormal(0, 1) differences (skewness 6.2) cover 0.880 at n = 8, 0.903 at n =
24 and 0.947 at n = 500, with a family-wise error of 0.33-0.38 over 30 tests at n <= 24
and still 0.077 at n = 500. BCa and a sign-flip test do no better there (same script).
So the tables flag (:data:`FLAG`) a cell whose sample lies outside the range
(:func:`outside_validity`, :data:`VALID_SKEWNESS`: a bound on the *sample* skewness per
n, chosen so that what stays unflagged keeps its coverage and error on every population
simulated).
"""

import warnings
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import TypeVar

import numpy as np

DEFAULT_BOOT = 1999
MIN_N = 3  # the bootstrap-t needs three samples (studentized's docstring)
# ((n, largest |sample skewness|), ...): where the bootstrap-t and Holm hold, measured by
# scripts/bootstrap_validity.py (results/bootstrap_validity.json, docs/statistics.md);
# tests/test_bootstrap_validity.py checks this copy against the JSON
VALID_SKEWNESS: tuple[tuple[int, float], ...] = ((8, 0.0), (16, 0.25), (24, 0.25), (50, 1.0), (100, 1.25),
                                                 (200, 2.0), (500, 3.0))
FLAG = "†"  # marks a table cell outside the validity range (flag_note)
K = TypeVar("K", bound=Hashable)


def studentized(x, n_boot: int = DEFAULT_BOOT, level: float = 0.95, seed: int = 0):
    """``(mean, low, high, p)`` of the symmetric bootstrap-t, vectorised: ``x`` is
    ``[..., n]`` (every leading index its own sample set, all resampled with the same
    indices); the results are ``[...]``. NaN interval and p where ``n < 3``: at ``n = 2``
    every resample with any spread has the sample's own mean, so ``|t*|`` is 0 and the
    interval would shrink to ``[m, m]`` with p at its floor -- "resolved" from two
    samples."""
    x = np.asarray(x, dtype=float)
    n = x.shape[-1]
    shape = x.shape[:-1]
    if n < MIN_N:
        nan = np.full(shape, np.nan)
        mean = x.mean(-1) if n else nan
        return mean, nan, nan, nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))
    m = x.mean(-1)
    s = x.std(-1, ddof=1) / np.sqrt(n)
    low, high, p = np.empty(shape), np.empty(shape), np.empty(shape)
    flat_x, flat_m, flat_s = x.reshape(-1, n), m.reshape(-1), s.reshape(-1)
    lo, hi, pv = low.reshape(-1), high.reshape(-1), p.reshape(-1)
    chunk = max(1, (1 << 23) // (n_boot * n))  # ~64 MB of resamples at a time
    for start in range(0, len(flat_x), chunk):
        stop = start + chunk
        xs = flat_x[start:stop][:, idx]  # [c, B, n]
        ms, ss = xs.mean(-1), xs.std(-1, ddof=1) / np.sqrt(n)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.abs(ms - flat_m[start:stop, None]) / ss
            t0 = np.abs(flat_m[start:stop] / flat_s[start:stop])
        # a resample of one repeated value has s* = 0 -- or, from round-off in its mean
        # (three draws of 0.1), s* ~ 1e-17 and a t* of 1e15 that would set the quantile
        # at n = 3: leave out every resample whose draws are all equal
        t[~np.isfinite(t) | (np.ptp(xs, axis=-1) == 0)] = np.nan
        with warnings.catch_warnings():  # every resample degenerate (s = 0): handled below
            warnings.simplefilter("ignore", RuntimeWarning)
            q = np.nanquantile(t, level, axis=-1)
        lo[start:stop] = flat_m[start:stop] - q * flat_s[start:stop]
        hi[start:stop] = flat_m[start:stop] + q * flat_s[start:stop]
        # the Monte Carlo p-value (1 + k) / (1 + B): never 0, so Holm's smallest threshold
        # (1 - level) / m can be met only for m <= (1 - level) (1 + B); whether P(p <= u)
        # <= u holds there depends on the data's skewness (the module docstring)
        pv[start:stop] = (1 + (t >= t0[:, None]).sum(-1)) / (1 + np.isfinite(t).sum(-1))
    flat = flat_s == 0  # no spread: the mean is exact
    lo[flat], hi[flat] = flat_m[flat], flat_m[flat]
    pv[flat] = np.where(flat_m[flat] == 0, 1.0, 0.0)
    return m, low, high, p


def sample_skewness(x) -> np.ndarray:
    """The adjusted Fisher-Pearson skewness ``G1 = g1 sqrt(n (n - 1)) / (n - 2)``,
    ``g1 = m3 / m2^1.5`` (``m_k``: the k-th central moment), along the last axis of ``x``
    (pandas' ``skew``, scipy's ``skew(bias=False)``). NaN where ``n < 3`` or every value
    is equal (no spread)."""
    x = np.asarray(x, dtype=float)
    n = x.shape[-1]
    if n < 3:
        return np.full(x.shape[:-1], np.nan)
    dev = x - x.mean(-1, keepdims=True)
    m2, m3 = (dev**2).mean(-1), (dev**3).mean(-1)
    scale = np.abs(x).max(-1) if x.size else 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        g1 = np.where(m2 > (1e-12 * scale) ** 2, m3 / m2**1.5, np.nan)
    return g1 * np.sqrt(n * (n - 1)) / (n - 2)


def skewness_bound(n: int, rule=None) -> float | None:
    """The largest ``|sample skewness|`` inside the validity range at ``n`` (``rule``,
    default :data:`VALID_SKEWNESS`; negative: none), or None below its smallest ``n``."""
    bounds = [bound for size, bound in (VALID_SKEWNESS if rule is None else rule) if size <= n]
    return bounds[-1] if bounds else None


def flag_note(n: int | None = None) -> str:
    """The footnote of a table whose cells carry :data:`FLAG`: with ``n``, the range at
    that sample size."""
    bound = None if n is None else skewness_bound(n)
    if n is None:
        steps = [(size, b) for k, (size, b) in enumerate(VALID_SKEWNESS)
                 if b > 0 and (k == 0 or b != VALID_SKEWNESS[k - 1][1])]
        where = ("|skewness| " + ", ".join(f"≤ {b:g} from n = {size}" for size, b in steps)
                 + f"; below n = {steps[0][0]}, no sample" if steps else "no sample")
    elif bound is None:
        where = f"it was measured from n = {VALID_SKEWNESS[0][0]} samples on; here n = {n}"
    elif bound <= 0:
        where = (f"at n = {n} no sample is inside it: so few values cannot show whether "
                 "their population is skewed")
    else:
        where = f"at n = {n} it holds up to |skewness| {bound:g}"
    return (f"{FLAG} outside the validity range of the bootstrap-t ({where}): the cell's "
            "per-sample values (for a difference, the paired differences) are more skewed "
            "than their number allows, or too few to tell, so its interval, and whether it "
            "is resolved, are approximate ([Statistics](statistics.md)).")


def outside_validity(n: int, skewness, rule=None):
    """Whether a sample of ``n`` values with sample skewness ``skewness``
    (:func:`sample_skewness`; a scalar or an array) lies outside the measured validity
    range (``rule``, default :data:`VALID_SKEWNESS`): ``n`` below its smallest ``n``, or
    ``|skewness|`` above the bound of its largest ``n`` not above ``n``. Never for NaN
    skewness (no spread: the interval is exact) or ``n < MIN_N`` (no interval)."""
    g = np.abs(np.asarray(skewness, dtype=float))
    bound = skewness_bound(n, rule)
    if n < MIN_N:
        out = np.zeros(g.shape, dtype=bool)
    else:
        with np.errstate(invalid="ignore"):
            out = ~np.isnan(g) & ((g > bound) if bound is not None else True)
    return bool(out) if out.ndim == 0 else out


def bootstrap_ci(values, n_boot: int = DEFAULT_BOOT, level: float = 0.95, seed: int = 0):
    """``(low, high)`` bootstrap-t interval of the mean (NaN for n < 3)."""
    _, low, high, _ = studentized(np.asarray(values, dtype=float), n_boot, level, seed)
    return float(low), float(high)


def positive_ci(values, n_boot: int = DEFAULT_BOOT, level: float = 0.95, seed: int = 0):
    """``(low, high)``: the bootstrap-t interval of the mean of a *positive* quantity (a
    perplexity), on the log scale: ``t*_b = (log m*_b - log m) / (s*_b / m*_b)`` (the
    standard error of ``log m`` by the delta method), ``m exp(-/+ q s / m)`` for ``q`` the
    ``level`` quantile of ``|t*|``. Always inside ``(0, inf)`` and around the mean ``m``
    itself, where the plain interval ``m -/+ q s`` of a few skewed values reaches below
    zero (four texts' perplexities: ``21.56 [-302.43, 345.56]``). Same resamples as
    :func:`studentized` with the same ``seed``; NaN for ``n < 3``; ``[m, m]`` without
    spread. Values that are not all positive get :func:`bootstrap_ci`'s interval."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < MIN_N or not (x > 0).all() or not np.isfinite(x).all():
        return bootstrap_ci(x, n_boot, level, seed)
    m, s = float(x.mean()), float(x.std(ddof=1) / np.sqrt(n))
    if s == 0:
        return m, m
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    xs = x[idx]
    ms, ss = xs.mean(-1), xs.std(-1, ddof=1) / np.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.abs(np.log(ms) - np.log(m)) / (ss / ms)
    t[~np.isfinite(t) | (np.ptp(xs, axis=-1) == 0)] = np.nan  # as studentized
    q = float(np.nanquantile(t, level))
    return m * float(np.exp(-q * s / m)), m * float(np.exp(q * s / m))


def bca_ci(values, n_boot: int = DEFAULT_BOOT, level: float = 0.95, seed: int = 0):
    """``(low, high)`` BCa (bias-corrected and accelerated) bootstrap interval of the mean
    (Efron 1987): the percentiles of the resampled means at ``Phi(z0 + (z0 + z) / (1 - a
    (z0 + z)))`` for ``z = Phi^-1((1 -/+ level) / 2)``, with the bias ``z0`` from the share
    of resampled means below the mean and the acceleration ``a`` from the jackknife.

    Used for the bands of the perturbation curves: each point is one rate's damage, which
    can be mostly float noise (a rate that masks nothing in short rows: 1 - cos ~ 6e-8)
    plus one or two real values. There the bootstrap-t interval explodes (a resample of
    the noise alone has a tiny standard error, so its ``t*`` is huge); BCa stays inside
    the resampled means' range.
    NaN for n < 2; ``[m, m]`` when every value is equal."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2:
        return float("nan"), float("nan")
    m = float(x.mean())
    if np.all(x == x[0]):
        return m, m
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, n, size=(n_boot, n))].mean(-1)
    share = (np.sum(means < m) + 0.5 * np.sum(means == m)) / n_boot
    share = min(max(share, 1 / (n_boot + 1)), n_boot / (n_boot + 1))
    normal = NormalDist()
    z0 = normal.inv_cdf(share)
    jack = (x.sum() - x) / (n - 1)  # leave-one-out means
    dev = jack.mean() - jack
    denom = 6.0 * float((dev**2).sum()) ** 1.5
    a = float((dev**3).sum()) / denom if denom > 0 else 0.0
    out = []
    for tail in ((1 - level) / 2, (1 + level) / 2):
        z = normal.inv_cdf(tail)
        out.append(float(np.quantile(means, normal.cdf(z0 + (z0 + z) / (1 - a * (z0 + z))))))
    return out[0], out[1]


@dataclass(frozen=True)
class PairedDifference:
    """``mean(b - a)`` over paired samples, its bootstrap-t interval and p-value.

    ``sign``: +1 if ``b > a`` is resolved, -1 if ``b < a`` is, 0 otherwise. Resolved:
    the interval excludes 0, or, after :func:`holm` (``resolved`` set), Holm's correction
    over the family rejects. ``identical``: every per-sample difference is exactly 0
    (e.g. two rankings that mask the same entries by construction): never resolved.
    ``flagged``: the differences' skewness is outside the measured validity range for
    this ``n`` (:data:`VALID_SKEWNESS`): the interval and the decision are approximate.
    """

    mean: float
    low: float
    high: float
    n: int
    identical: bool
    p: float = float("nan")
    resolved: bool | None = None  # set by holm(): the family-wise decision
    skewness: float = float("nan")  # of the per-sample differences (sample_skewness)

    @property
    def flagged(self) -> bool:
        """The differences lie outside the range where the bootstrap-t and Holm were
        measured to hold (:func:`outside_validity`): too skewed for this ``n``."""
        return not self.identical and bool(outside_validity(self.n, self.skewness))

    @property
    def sign(self) -> int:
        if self.identical or not np.isfinite(self.low):
            return 0
        if self.resolved is not None:
            return int(np.sign(self.mean)) if self.resolved else 0
        if self.low > 0:
            return 1
        if self.high < 0:
            return -1
        return 0


def paired_bootstrap(a, b, n_boot: int = DEFAULT_BOOT, level: float = 0.95, seed: int = 0) -> PairedDifference:
    """Bootstrap-t of the mean per-sample difference ``b - a`` (same length, same sample
    order). ``n < 3`` gives a NaN interval (unresolved unless identical)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired samples need equal lengths; got {a.shape} and {b.shape}.")
    d = b - a
    mean, low, high, p = studentized(d, n_boot, level, seed)
    mean = float(d.mean()) if len(d) else float("nan")
    return PairedDifference(mean, float(low), float(high), len(d), bool(len(d)) and bool((d == 0).all()),
                            float(p), skewness=float(sample_skewness(d)))


def paired_frame_difference(df, by: str, a: str, b: str, on: str = "sample_id", value: str = "value",
                            **kwargs) -> PairedDifference:
    """:func:`paired_bootstrap` of rows of ``df`` where ``df[by] == b`` minus those where
    ``df[by] == a``, paired on the ``on`` column (samples present in both only)."""
    left = df.loc[df[by] == a, [on, value]].set_index(on)[value]
    right = df.loc[df[by] == b, [on, value]].set_index(on)[value]
    common = sorted(set(left.index) & set(right.index))
    return paired_bootstrap(left.loc[common].to_numpy(), right.loc[common].to_numpy(), **kwargs)


def holm_reject(p, alpha: float = 0.05) -> np.ndarray:
    """Holm's step-down rejections of p-values ``p`` (a family along the last axis; NaN
    never rejected): sort ascending, reject ``p_(k) <= alpha / (m - k + 1)`` until the
    first that fails."""
    p = np.asarray(p, dtype=float)
    flat = np.where(np.isnan(p), np.inf, np.atleast_1d(p))
    m = flat.shape[-1]
    order = np.argsort(flat, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(flat, order, -1)
    ok = sorted_p <= alpha / (m - np.arange(m))
    ok = np.cumprod(ok, axis=-1).astype(bool)  # stop at the first failure
    out = np.empty_like(ok)
    np.put_along_axis(out, order, ok, -1)
    return out.reshape(p.shape) if p.ndim else out


def holm(family: Mapping[K, PairedDifference], level: float = 0.95) -> dict[K, PairedDifference]:
    """The family's differences with ``resolved`` set by Holm's correction at ``1 -
    level`` (identical pairs are never resolved and do not count as tests)."""
    keys = [k for k, d in family.items() if not d.identical]
    rejected: list[bool] = list(holm_reject([family[k].p for k in keys], 1 - level)) if keys else []
    out = {k: replace(d, resolved=False) for k, d in family.items()}
    for k, r in zip(keys, rejected, strict=True):
        out[k] = replace(family[k], resolved=bool(r))
    return out
