"""Seeded percentile bootstrap intervals: of a mean, and of a paired mean difference.

For samples ``x_1..x_n`` the bootstrap draws ``B`` resamples of size ``n`` with
replacement (indices ``I_b``) and takes the ``(1-level)/2`` and ``(1+level)/2`` quantiles
of the resampled means ``mean(x[I_b])``.

Paired comparisons (two metrics scored on the same samples) resample *samples*, not
values: the per-sample differences ``d_k = b_k - a_k`` carry the pairing, so the interval
of ``mean(d[I_b])`` is much narrower than two separate intervals would suggest when the
two metrics move together across samples, and honest when they do not. A difference is
*resolved* when its interval excludes 0.
"""

from dataclasses import dataclass

import numpy as np


def bootstrap_ci(values, n_boot: int = 2000, level: float = 0.95, seed: int = 0):
    """``(low, high)`` percentile bootstrap interval of the mean (NaN for n < 2)."""
    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(1)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


@dataclass(frozen=True)
class PairedDifference:
    """``mean(b - a)`` over paired samples and its bootstrap interval.

    ``sign``: +1 if the interval lies above 0 (b > a resolved), -1 below (b < a
    resolved), 0 if it contains 0 (unresolved). ``identical``: every per-sample difference
    is exactly 0 (e.g. two rankings that mask the same entries by construction).
    """

    mean: float
    low: float
    high: float
    n: int
    identical: bool

    @property
    def sign(self) -> int:
        if self.identical or not np.isfinite(self.low):
            return 0
        if self.low > 0:
            return 1
        if self.high < 0:
            return -1
        return 0


def paired_bootstrap(a, b, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> PairedDifference:
    """Bootstrap of the mean per-sample difference ``b - a`` (same length, same sample
    order). ``n < 2`` gives a NaN interval (unresolved unless identical)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"paired samples need equal lengths; got {a.shape} and {b.shape}.")
    d = b - a
    low, high = bootstrap_ci(d, n_boot, level, seed)
    mean = float(d.mean()) if len(d) else float("nan")
    return PairedDifference(mean, low, high, len(d), bool(len(d)) and bool((d == 0).all()))


def paired_frame_difference(df, by: str, a: str, b: str, on: str = "sample_id", value: str = "value",
                            **kwargs) -> PairedDifference:
    """:func:`paired_bootstrap` of rows of ``df`` where ``df[by] == b`` minus those where
    ``df[by] == a``, paired on the ``on`` column (samples present in both only)."""
    left = df.loc[df[by] == a, [on, value]].set_index(on)[value]
    right = df.loc[df[by] == b, [on, value]].set_index(on)[value]
    common = sorted(set(left.index) & set(right.index))
    return paired_bootstrap(left.loc[common].to_numpy(), right.loc[common].to_numpy(), **kwargs)
