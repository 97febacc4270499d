"""The sink-rate sweep: output norm as a function of the sink rate ``s``.

For each head (and for the layer output, with every head set to ``s``: ``head = -1``)
the pattern is changed as :func:`cwlens.core.sinks.set_sink_rate` does (sink attention
``s``, tail scaled by ``(1 - s)/(1 - a_i0)``), and ``||o(s)||`` is

- *swept*: recomputed from the changed pattern on :data:`SWEPT_GRID` (what the
  :func:`cwlens.engine.interventions.sinks.sink_rate_hook` does to that layer's output), and
- *closed form*: ``||s A + (1 - s) B||`` with its minimiser ``s*`` (``METHOD.md`` s. 5).

:func:`sweep_statistics` returns one row per ``(sample, layer, head)``:

- ``actual_rate``: mean ``a_i0`` over the queries after the sink;
- ``interior_frac``: fraction of queries whose ``s*`` lies strictly inside (0, 1);
- ``s_star_median``: median of ``argmin_[0,1] ||o(s)||`` (s* clipped to [0, 1]);
- ``below_actual_frac``: fraction of queries whose minimiser is below their own ``a_i0``
  (more sink attention would make the output *larger*);
- ``norm_min_over_actual`` / ``norm_one_over_actual`` / ``norm_zero_over_actual``: mean
  ``||o||`` at the minimiser / at ``s = 1`` / at ``s = 0``, over the mean at the actual rate;
- ``swept_max_rel_error``: the worst gap between swept and closed-form norms (relative to
  the largest norm on the curve), and ``convex_frac``: the fraction of swept curves whose
  second differences are all >= ``-1e-5`` of the curve's scale.

:func:`sweep_curves` returns the mean closed-form curve per ``(sample, layer, head, s)``
(``norm`` and ``norm_rel`` = mean ``||o(s)||`` over mean ``||o(a_i0)||``).
"""

import pandas as pd
import torch

from cwlens.core.geometry import AttentionGeometry
from cwlens.core.sinks import (
    SinkGeometry,
    curve_argmin,
    curve_minimizer,
    curve_norm,
    first_real_index,
    set_sink_rate,
)
from cwlens.engine import adapter
from cwlens.engine.entry import ModelLike, takes_model

GRID = torch.linspace(0, 1, 21)
#: The swept check uses every other point of :data:`GRID`.
SWEPT_GRID = GRID[::2]
CONVEX_TOL = 1e-5


def swept_norms(sg: SinkGeometry, grid=SWEPT_GRID) -> tuple[torch.Tensor, torch.Tensor]:
    """Norms recomputed from the changed pattern: per head ``[S, batch, head, query]`` and
    for the layer output ``[S, batch, query]`` (``o = sum_j a'_ij v~_j``, as the hooked
    model computes it)."""
    geo = sg.geo
    gram, W_O = geo.gram, geo.W_O
    heads, layer = [], []
    for s in grid.tolist():
        p = set_sink_rate(geo.pattern, s, sg.sink_index)
        z = AttentionGeometry(p, geo.v, W_O).z  # [b, q, h, d]
        zg = torch.einsum("bqhd,hde->bqhe", z, gram)
        heads.append((zg * z).sum(-1).clamp_min(0).sqrt().permute(0, 2, 1))
        layer.append(torch.einsum("bqhd,hdm->bqm", z, W_O).norm(dim=-1))
    return torch.stack(heads), torch.stack(layer)


def convex(curves: torch.Tensor, tol: float = CONVEX_TOL) -> torch.Tensor:
    """Whether each curve (first axis = the evenly spaced grid) has all second differences
    ``>= -tol * max|curve|``."""
    d2 = curves[2:] - 2 * curves[1:-1] + curves[:-2]
    scale = curves.abs().amax(0).clamp_min(1e-30)
    return (d2 >= -tol * scale).all(0)


def _curve_summary(aa, bb, ab, valid, swept, alpha0, grid) -> dict[str, torch.Tensor]:
    """Per-row (all leading axes but the query axis) summaries of one family of curves."""
    w = valid.to(aa.dtype)
    n = w.sum(-1).clamp_min(1)

    def mean(x):
        return (x * w).sum(-1) / n

    s_star, interior = curve_minimizer(aa, bb, ab)
    arg = curve_argmin(aa, bb, ab)
    at_actual = _norm_at(alpha0, aa, bb, ab)
    at_min = _norm_at(arg, aa, bb, ab)
    denom = mean(at_actual).clamp_min(1e-30)
    closed = curve_norm(grid.to(aa.dtype), aa, bb, ab)
    gap = (swept - closed).abs() / closed.abs().amax(0).clamp_min(1e-30)
    gap = torch.where(valid, gap, torch.zeros_like(gap)).amax(0)
    arg_masked = torch.where(valid, arg, torch.full_like(arg, float("nan")))
    return {
        "actual_rate": mean(alpha0),
        "interior_frac": mean((interior & valid).to(aa.dtype)),
        "s_star_median": arg_masked.nanmedian(-1).values,
        "below_actual_frac": mean((arg < alpha0).to(aa.dtype)),
        "norm_min_over_actual": mean(at_min) / denom,
        "norm_one_over_actual": mean(aa.clamp_min(0).sqrt()) / denom,
        "norm_zero_over_actual": mean(bb.clamp_min(0).sqrt()) / denom,
        "swept_max_rel_error": gap.amax(-1),
        "convex_frac": mean((convex(swept) | ~valid).to(aa.dtype)),
        "n_queries": w.sum(-1),
    }


def _norm_at(s: torch.Tensor, aa, bb, ab) -> torch.Tensor:
    return (s**2 * aa + 2 * s * (1 - s) * ab + (1 - s) ** 2 * bb).clamp_min(0).sqrt()


def layer_sweep(sg: SinkGeometry, grid=GRID, swept_grid=SWEPT_GRID, swept: bool = True):
    """``(head_stats, layer_stats, head_curve, layer_curve)`` for one layer: stats are
    dicts of ``[batch, head]`` / ``[batch]`` tensors, curves ``[S, batch, head]`` /
    ``[S, batch]`` mean norms (closed form) plus the mean norm at the actual rate.

    ``swept=False`` skips the recomputation from the pattern (the closed form alone; the
    ``swept_max_rel_error`` and ``convex_frac`` columns are then NaN)."""
    aa, bb, ab = sg.dots
    la, lb, lab = sg.layer_dots
    if swept:
        swept_h, swept_l = swept_norms(sg, swept_grid)
    else:
        swept_h = curve_norm(swept_grid.to(aa.dtype), aa, bb, ab)
        swept_l = curve_norm(swept_grid.to(la.dtype), la, lb, lab)
    head_stats = _curve_summary(aa, bb, ab, sg.valid, swept_h, sg.alpha0, swept_grid)
    lvalid = sg.layer_valid
    # the layer output at "the actual rate" is the clean output: o(s) with each head's own
    # a_i0 is not one point of the common-s curve, so compare with the clean norm instead
    clean = sg.geo.output_norm("inter")[:, 0]
    layer_stats = _curve_summary(la, lb, lab, lvalid, swept_l, sg.alpha0.mean(1), swept_grid)
    w = lvalid.to(la.dtype)
    layer_stats["norm_min_over_actual"] = (
        (_norm_at(curve_argmin(la, lb, lab), la, lb, lab) * w).sum(-1)
        / (clean * w).sum(-1).clamp_min(1e-30)
    )
    if not swept:
        for stats in (head_stats, layer_stats):
            stats["swept_max_rel_error"] = torch.full_like(stats["actual_rate"], float("nan"))
            stats["convex_frac"] = torch.full_like(stats["actual_rate"], float("nan"))
    hw = sg.valid.to(aa.dtype)
    head_curve = (sg.curve(grid) * hw).sum(-1) / hw.sum(-1).clamp_min(1)
    layer_curve = (curve_norm(grid.to(la.dtype), la, lb, lab) * w).sum(-1) / w.sum(-1).clamp_min(1)
    head_ref = (sg.geo.output_norm("intra") * hw).sum(-1) / hw.sum(-1).clamp_min(1)
    layer_ref = (clean * w).sum(-1) / w.sum(-1).clamp_min(1)
    return head_stats, layer_stats, (head_curve, head_ref), (layer_curve, layer_ref)


@takes_model
def sweep_statistics(
    cache, model: ModelLike, attention_mask=None, layers=None, sample_ids=None, grid=GRID,
    swept: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(stats, curves)``: see the module docstring; ``head = -1`` is the layer output.
    ``attention_mask`` None: the mask remembered with a padded batch's cache
    (``cwlens.run_with_cache`` of a list of texts), so each row's sink is its first real
    token and its pad queries are left out."""
    resolved, _ = adapter.resolve_requested_layers(model.n_layers, layers)
    if attention_mask is None:
        attention_mask = adapter.cache_mask(cache)
    parts = [layer_sweep_tables(adapter.geometry(cache, model, ly, attention_mask), ly,
                                attention_mask, sample_ids, grid, swept) for ly in resolved]
    return (pd.concat([p[0] for p in parts], ignore_index=True),
            pd.concat([p[1] for p in parts], ignore_index=True))


def layer_sweep_tables(
    geo, ly: int, attention_mask=None, sample_ids=None, grid=GRID, swept: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rows of :func:`sweep_statistics` for one layer's geometry (streaming-friendly;
    ``attention_mask`` None: the geometry's own ``position_mask``)."""
    stats, curves = [], []
    if attention_mask is None:
        attention_mask = geo.position_mask
    mask = None if attention_mask is None else attention_mask.bool()
    b, h = geo.pattern.shape[:2]
    sg = SinkGeometry(geo, first_real_index(mask, b, geo.pattern.device))
    hs, ls, (hc, href), (lc, lref) = layer_sweep(sg, grid, swept=swept)
    ids = list(range(b)) if sample_ids is None else list(sample_ids)
    heads = list(range(h)) + [-1]
    cols = {
        k: torch.cat([hs[k], ls[k][:, None]], 1).float().cpu().numpy()  # [b, h + 1]
        for k in hs
    }
    for i in range(b):
        for j, head in enumerate(heads):
            stats.append({"sample": ids[i], "layer": ly, "head": head,
                          **{k: float(v[i, j]) for k, v in cols.items()}})
    curve = torch.cat([hc, lc[..., None]], -1).float().cpu()  # [S, b, h + 1]
    ref = torch.cat([href, lref[:, None]], -1).float().cpu()  # [b, h + 1]
    for si, s in enumerate(grid.tolist()):
        for i in range(b):
            for j, head in enumerate(heads):
                curves.append((ids[i], ly, head, s, float(curve[si, i, j]), float(ref[i, j])))
    curve_df = pd.DataFrame(curves, columns=["sample", "layer", "head", "s", "norm", "norm_actual"])
    return pd.DataFrame(stats), curve_df


def curve_summary(curves: pd.DataFrame) -> pd.DataFrame:
    """Mean curve per ``(layer, head, s)``: ``norm_rel`` = mean norm / mean norm at the actual rate."""
    g = curves.groupby(["layer", "head", "s"], as_index=False)[["norm", "norm_actual"]].mean()
    g["norm_rel"] = g["norm"] / g["norm_actual"].clip(lower=1e-30)
    return g
