"""The observed sink-rate / output-norm relation: each head's actual ``||o_i^h||`` against
its actual sink attention ``a_i0^h``, across queries and texts.

The sink-rate *curve* of :mod:`cwlens.sinks.sweep` is counterfactual (one query, its sink
rate moved to ``s``, the tail held) and convex by construction (the norm of the affine
map ``s A + (1 - s) B``). What the model actually does is a different question: across
the (query, text) pairs of one head, how does the output norm vary with the sink rate it
chose? That relation can take any shape, so it is measured, not derived:

- :func:`observed_bins`: per ``(layer, head, bin)`` of sink rate (10 equal bins of
  ``[0, 1]``) the sufficient statistics ``n, sum r, sum r^2, sum r^3, sum r^4, sum y,
  sum r y, sum r^2 y, sum y^2`` of ``r = a_i0``, ``y = ||o_i^h||`` over the real queries
  after the sink, plus the smallest and largest ``r``. They add up over batches.
- :func:`head_fits`: per head, the **shape** read from the binned means with their
  intervals (:mod:`cwlens.sinks.observed_shape`: ``interior`` only with a resolved fall
  before *and* a resolved rise after the bin of smallest mean; else ``falling``,
  ``rising``, ``flat``), the Pearson correlation of ``r`` and ``y``, and, as a coarse
  summary only, the least-squares quadratic ``y ~ c0 + c1 r + c2 r^2`` over all points
  (from the sums, float64) with where its minimum falls (``quad_minimum``: ``interior``
  when ``c2 > 0`` and ``r* = -c1 / (2 c2)`` lies strictly inside ``(r_min, r_max)``, else
  ``low`` / ``high``). The quadratic calls a head that falls and then flattens
  "interior" nearly always, so no verdict is read from it.
- :func:`layer_fits` / :func:`bin_summary`: the same pooled over a layer's heads, each
  head's norms divided by its own mean norm (``y / mean_h y``), so heads of different
  scales share one curve; :func:`bin_summary` gives each bin's mean with its interval.
"""

from typing import Any

import numpy as np
import pandas as pd
import torch

from cwlens.core.sinks import SinkGeometry, first_real_index
from cwlens.engine import adapter
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.sinks.observed_shape import RULE, SHAPES, bin_means, shape_of

N_BINS = 10
SUMS = ("n", "s_r", "s_r2", "s_r3", "s_r4", "s_y", "s_ry", "s_r2y", "s_y2")


def layer_points(sg: SinkGeometry) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(rate, norm, valid)`` per head and query, each ``[batch, head, query]``:
    ``a_i0^h``, ``||o_i^h||`` and the real queries after the sink."""
    valid = sg.real_query[:, None, :].expand_as(sg.alpha0)
    return sg.alpha0, sg.geo.output_norm("intra"), valid


def _bin_sums(rate, norm, valid, n_bins: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(sums [head, bin, 9], r_min [head, bin], r_max [head, bin])`` in float64."""
    h = rate.shape[1]
    r = rate.double().transpose(0, 1).reshape(h, -1)  # [h, b*q]
    y = norm.double().transpose(0, 1).reshape(h, -1)
    ok = valid.transpose(0, 1).reshape(h, -1)
    b = (r * n_bins).floor().clamp(0, n_bins - 1).long()
    cols = torch.stack([torch.ones_like(r), r, r**2, r**3, r**4, y, r * y, r**2 * y, y**2], -1)
    cols = cols * ok[..., None]
    sums = torch.zeros(h, n_bins, len(SUMS), dtype=torch.float64)
    sums.scatter_add_(1, b[..., None].expand_as(cols), cols)
    big = torch.full((h, n_bins), float("inf"), dtype=torch.float64)
    r_min = big.scatter_reduce(1, b, torch.where(ok, r, float("inf")), "amin")
    r_max = (-big).scatter_reduce(1, b, torch.where(ok, r, -float("inf")), "amax")
    return sums, r_min, r_max


@takes_model
def observed_bins(cache, model: ModelLike, attention_mask=None, layers=None, n_bins: int = N_BINS):
    """One row per non-empty ``(layer, head, bin)`` (see the module docstring)."""
    resolved, _ = adapter.resolve_requested_layers(model.n_layers, layers)
    if attention_mask is None:  # a padded batch's cache (cwlens.run_with_cache of texts)
        attention_mask = adapter.cache_mask(cache)
    return pd.concat([layer_bins(adapter.geometry(cache, model, ly, attention_mask), ly,
                                 attention_mask, n_bins) for ly in resolved], ignore_index=True)


def layer_bins(geo, ly: int, attention_mask=None, n_bins: int = N_BINS) -> pd.DataFrame:
    """The rows of :func:`observed_bins` for one layer's geometry (streaming-friendly)."""
    mask = None if attention_mask is None else attention_mask.bool()
    sink = first_real_index(mask, geo.pattern.shape[0], geo.pattern.device)
    return points_bins(*layer_points(SinkGeometry(geo, sink)), ly, n_bins)


def points_bins(rate, norm, valid, ly: int = 0, n_bins: int = N_BINS) -> pd.DataFrame:
    """The rows of :func:`observed_bins` from points ``(rate, norm, valid)``, each
    ``[batch, head, query]`` (as :func:`layer_points` gives them)."""
    sums, r_min, r_max = _bin_sums(rate, norm, valid, n_bins)
    h = sums.shape[0]
    df = pd.DataFrame(sums.reshape(h * n_bins, -1).cpu().numpy(), columns=list(SUMS))
    df.insert(0, "bin", np.tile(np.arange(n_bins), h))
    df.insert(0, "head", np.repeat(np.arange(h), n_bins))
    df.insert(0, "layer", ly)
    df["r_min"], df["r_max"] = r_min.flatten().numpy(), r_max.flatten().numpy()
    return df[df["n"] > 0]


def combine_bins(bins: pd.DataFrame) -> pd.DataFrame:
    """Add up the bins of several batches."""
    agg = {c: "sum" for c in SUMS} | {"r_min": "min", "r_max": "max"}
    return bins.groupby(["layer", "head", "bin"], as_index=False).agg(agg)


def _fit(s: pd.Series | dict, r_lo: float, r_hi: float) -> dict:
    """Quadratic least squares from the sums, the correlation and the fitted minimum."""
    n = s["n"]
    out = {"n": int(n), "r_min": r_lo, "r_max": r_hi, "mean_rate": s["s_r"] / n,
           "mean_norm": s["s_y"] / n}
    var_r = s["s_r2"] / n - (s["s_r"] / n) ** 2
    var_y = s["s_y2"] / n - (s["s_y"] / n) ** 2
    cov = s["s_ry"] / n - s["s_r"] * s["s_y"] / n**2
    out["corr"] = cov / np.sqrt(var_r * var_y) if var_r > 1e-18 and var_y > 1e-18 else np.nan
    A = np.array([[n, s["s_r"], s["s_r2"]], [s["s_r"], s["s_r2"], s["s_r3"]],
                  [s["s_r2"], s["s_r3"], s["s_r4"]]], dtype=np.float64)
    rhs = np.array([s["s_y"], s["s_ry"], s["s_r2y"]], dtype=np.float64)
    if n < 3 or r_hi - r_lo < 1e-6:
        return out | {"c0": np.nan, "c1": np.nan, "c2": np.nan, "r_star": np.nan,
                      "minimum": "undetermined", "norm_at_min_rel": np.nan}
    c0, c1, c2 = np.linalg.lstsq(A, rhs, rcond=None)[0]
    grid = np.linspace(r_lo, r_hi, 201)
    curve = c0 + c1 * grid + c2 * grid**2
    r_star = -c1 / (2 * c2) if c2 > 0 else np.nan
    if c2 > 0 and r_lo < r_star < r_hi:
        where, at = "interior", c0 + c1 * r_star + c2 * r_star**2
    else:
        i = int(np.argmin(curve))
        where, at = ("low" if i < len(grid) / 2 else "high"), curve[i]
    return out | {"c0": c0, "c1": c1, "c2": c2, "r_star": r_star, "minimum": where,
                  "norm_at_min_rel": at / out["mean_norm"] if out["mean_norm"] > 0 else np.nan}


def head_fits(bins: pd.DataFrame) -> pd.DataFrame:
    """Per ``(layer, head)``: the fit of the module docstring."""
    g = combine_bins(bins).groupby(["layer", "head"])
    rows = []
    for (ly, h), d in g:
        s = d[list(SUMS)].sum()
        rows.append({"layer": ly, "head": h, **_quadratic(s, d["r_min"].min(), d["r_max"].max()),
                     **shape_of(bin_means(d))})
    return pd.DataFrame(rows)


def _quadratic(s, r_lo: float, r_hi: float) -> dict:
    """:func:`_fit` with its minimum columns named as the quadratic's."""
    fit = _fit(s, r_lo, r_hi)
    fit["quad_minimum"] = fit.pop("minimum")
    fit["quad_norm_at_min_rel"] = fit.pop("norm_at_min_rel")
    return fit


def _relative(bins: pd.DataFrame) -> pd.DataFrame:
    """The sums with each head's norms divided by its own mean norm."""
    b = combine_bins(bins)
    per_head = b.groupby(["layer", "head"])[["n", "s_y"]].transform("sum")
    m = (per_head["s_y"] / per_head["n"]).replace(0, np.nan)
    b = b.copy()
    for c in ("s_y", "s_ry", "s_r2y"):
        b[c] = b[c] / m
    b["s_y2"] = b["s_y2"] / m**2
    return b.fillna(0.0)


def layer_fits(bins: pd.DataFrame) -> pd.DataFrame:
    """Per layer: the fit of the heads' relative norms pooled (``mean_norm`` is then ~1)."""
    rows = []
    for ly, d in _relative(bins).groupby("layer"):
        pooled = d.groupby("bin", as_index=False)[list(SUMS)].sum()
        rows.append({"layer": ly, **_quadratic(d[list(SUMS)].sum(), d["r_min"].min(), d["r_max"].max()),
                     **shape_of(bin_means(pooled))})
    return pd.DataFrame(rows)


def bin_summary(bins: pd.DataFrame, by_layer: bool = True) -> pd.DataFrame:
    """Per ``(layer, bin)`` (or per bin over all layers): ``n``, mean sink rate, mean
    relative norm ``||o^h|| / mean_h ||o^h||`` of the pooled heads, its standard error and
    95% interval (``norm_rel_se``, ``norm_rel_low``, ``norm_rel_high``; points treated as
    independent, see :mod:`cwlens.sinks.observed_shape`)."""
    keys = ["layer", "bin"] if by_layer else ["bin"]
    d = bin_means(_relative(bins).groupby(keys, as_index=False)[["n", "s_r", "s_y", "s_y2"]].sum())
    d = d.rename(columns={"mean": "norm_rel", "se": "norm_rel_se", "low": "norm_rel_low",
                          "high": "norm_rel_high"})
    return d[keys + ["n", "rate", "norm_rel", "norm_rel_se", "norm_rel_low", "norm_rel_high"]]


def summary(bins: pd.DataFrame, sink_heads: set | None = None) -> dict:
    """Headline numbers for ``summary.json`` and the printed summary. The shape fractions
    are over all heads (``observed_heads``; ``undetermined``: fewer than 3 bins of enough
    points, ``observed_testable_heads`` are the others); the quadratic's
    interior fraction is kept as ``observed_quad_interior_frac_heads`` for comparison."""
    fits = head_fits(bins)
    fitted = fits[fits["shape"] != "undetermined"]
    interior = fitted[fitted["shape"] == "interior"]
    quad = fits[fits["quad_minimum"] != "undetermined"]
    out: dict[str, Any] = {
        "observed_rule": RULE,
        "observed_heads": int(len(fits)),
        "observed_testable_heads": int(len(fitted)),
        **{f"observed_{k}_frac_heads": float((fits["shape"] == k).mean()) for k in SHAPES},
        "observed_corr_median": float(fits["corr"].median()),
        "observed_min_rate_median_interior": float(interior["min_rate"].median()),
        "observed_rise_median_interior": float(interior["rise"].median()),
        "observed_quad_interior_frac_heads": float((quad["quad_minimum"] == "interior").mean()),
    }
    if sink_heads:
        keys = list(zip(fits["layer"], fits["head"], strict=True))
        sel = fits[np.array([k in sink_heads for k in keys], dtype=bool)]
        out["observed_interior_frac_sink_heads"] = float((sel["shape"] == "interior").mean())
        out["observed_corr_median_sink_heads"] = float(sel["corr"].median())
    pooled = bin_summary(bins, by_layer=False)
    out["observed_norm_rel_by_bin"] = {
        f"{b / N_BINS:.1f}-{(b + 1) / N_BINS:.1f}": round(float(v), 4)
        for b, v in zip(pooled["bin"], pooled["norm_rel"], strict=True)
    }
    return out


def format_line(s: dict) -> str:
    """The summary line of ``cwlens sinks`` (the counterfactual curve's is separate)."""
    if "observed_falling_frac_heads" not in s:
        return ""
    bins = s["observed_norm_rel_by_bin"]
    ends = f"{next(iter(bins.values())):.2f} (rate {next(iter(bins))}) to " \
           f"{list(bins.values())[-1]:.2f} (rate {list(bins)[-1]})"
    sink = ""
    if "observed_interior_frac_sink_heads" in s:
        sink = f" ({100 * s['observed_interior_frac_sink_heads']:.0f}% of sink heads)"
    pct = {k: 100 * s[f"observed_{k}_frac_heads"] for k in ("interior", "falling", "rising", "flat")}
    return (
        f"  observed ||o^h|| vs own sink rate (across queries, binned means): interior minimum "
        f"(resolved fall, then resolved rise) for {pct['interior']:.0f}% of heads{sink}; falling "
        f"{pct['falling']:.0f}%, rising {pct['rising']:.0f}%, flat {pct['flat']:.0f}%, "
        f"undetermined {100 * s['observed_undetermined_frac_heads']:.0f}% "
        f"[a quadratic fit would say interior for "
        f"{100 * s['observed_quad_interior_frac_heads']:.0f}%]; median corr(rate, norm) "
        f"{s['observed_corr_median']:+.2f}; relative norm from {ends}"
    )
