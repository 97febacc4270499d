"""The shape of the observed sink-rate / norm relation, read from binned means.

A quadratic fitted over raw points calls a head whose norm falls and then flattens
"interior minimum" nearly always (its vertex lands inside the range), so the verdict
here is read from the binned means themselves, with their intervals:

- per bin ``b`` with at least ``min_n`` points: the mean norm ``m_b``, its standard
  error ``se_b = sd_b / sqrt(n_b)`` (from the additive sums ``n, sum y, sum y^2``) and
  the interval ``m_b +- 1.96 se_b``;
- ``b*``: the bin of smallest mean; the **rise** after it is the mean of all points in
  the later bins, pooled, minus ``m_b*``; it is *resolved* when it exceeds
  ``z * sqrt(se_after^2 + se_b*^2)``; the **fall** before it likewise with the earlier
  bins, with ``z`` Bonferroni-corrected over the ``k (k - 1) / 2`` pairs of the
  ``k`` usable bins (two-sided 1%: ``z = Phi^-1(1 - 0.01 / (k (k - 1)))``, 3.69 for 10
  bins) -- the minimum bin is picked *after* looking, so every pair could have been the
  one compared. At 1% per head, a model's ~200-300 heads give at most a few false
  "interior" heads where every head is truly monotone (on 400 synthetic falling-then-flat
  heads: none; at 5% one);
- **shape**: ``interior`` (resolved fall before *and* resolved rise after the minimum),
  ``falling`` (resolved fall, no resolved rise: the minimum is at the top or on a
  floor), ``rising`` (the mirror image), ``flat`` (neither), ``undetermined`` (fewer than
  3 usable bins).

The standard errors treat the (query, text) points of a bin as independent; queries of
one text are not, so the intervals are, if anything, too narrow -- the Bonferroni ``z``
is the margin against that.
"""

from statistics import NormalDist

import numpy as np
import pandas as pd

MIN_BIN_N = 20
ALPHA = 0.01
SHAPES = ("interior", "falling", "rising", "flat", "undetermined")


def bin_means(sums: pd.DataFrame) -> pd.DataFrame:
    """Add ``rate, mean, se, low, high`` (95% normal interval) to rows of sums with
    columns ``n, s_r, s_y, s_y2`` (one row per bin)."""
    d = sums.copy()
    n = d["n"].astype(float)
    d["rate"] = d["s_r"] / n
    d["mean"] = d["s_y"] / n
    var = ((d["s_y2"] - d["s_y"] ** 2 / n) / (n - 1)).where(n > 1).clip(lower=0.0)
    d["se"] = np.sqrt(var / n)
    half = NormalDist().inv_cdf(0.975) * d["se"]
    d["low"], d["high"] = d["mean"] - half, d["mean"] + half
    return d


def critical_z(k: int, alpha: float = ALPHA) -> float:
    """Two-sided Bonferroni ``z`` over the ``k (k - 1) / 2`` pairs of ``k`` bins."""
    return NormalDist().inv_cdf(1 - alpha / (k * (k - 1)))


def _pooled(d: pd.DataFrame, at: int, sel: np.ndarray) -> tuple[float, float]:
    """``(m_sel - m_at, z)``: the mean over the points of the bins ``sel`` pooled, minus
    the mean of bin ``at``, and that difference over its standard error."""
    if not sel.any():
        return 0.0, 0.0
    p = bin_means(d.loc[sel, ["n", "s_r", "s_y", "s_y2"]].sum().to_frame().T).iloc[0]
    diff = float(p["mean"] - d["mean"].iloc[at])
    se = float(np.sqrt(p["se"] ** 2 + d["se"].iloc[at] ** 2))
    if se > 0:
        return diff, diff / se
    return diff, np.inf if diff > 0 else 0.0


def shape_of(bins: pd.DataFrame, min_n: int = MIN_BIN_N, alpha: float = ALPHA) -> dict:
    """The shape of one curve from its bins (rows of :func:`bin_means`, any order).

    Returns ``shape``, ``n_bins_used``, ``min_rate`` (mean rate in the minimum bin),
    ``rise``/``fall`` (pooled mean after/before the minimum bin minus its mean, in units of the
    curve's overall mean), ``rise_z``/``fall_z`` and ``z_crit``.
    """
    d = bins[bins["n"] >= min_n].sort_values("bin").reset_index(drop=True)
    k = len(d)
    out: dict = {"shape": "undetermined", "n_bins_used": k, "min_rate": np.nan, "rise": np.nan,
                 "rise_z": np.nan, "fall": np.nan, "fall_z": np.nan, "z_crit": np.nan}
    if k < 3:
        return out
    overall = float(d["s_y"].sum() / d["n"].sum())
    at = int(np.argmin(d["mean"].to_numpy()))
    idx = np.arange(k)
    rise, rise_z = _pooled(d, at, idx > at)
    fall, fall_z = _pooled(d, at, idx < at)
    z = critical_z(k, alpha)
    up, down = rise_z > z, fall_z > z
    shape = "interior" if up and down else "falling" if down else "rising" if up else "flat"
    scale = overall if overall != 0 else np.nan
    return out | {"shape": shape, "min_rate": float(d["rate"].iloc[at]), "rise": rise / scale,
                  "rise_z": rise_z, "fall": fall / scale, "fall_z": fall_z, "z_crit": z}


RULE = (f"interior = a resolved fall before and a resolved rise after the bin of smallest "
        f"mean norm (bins of >= {MIN_BIN_N} points; difference > z * its SE, z Bonferroni-"
        f"corrected over all pairs of bins at 1%, 3.69 for 10 bins)")
