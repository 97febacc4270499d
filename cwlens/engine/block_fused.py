"""The streamed pass's usual questions of one block answered in one C call.

``stream_reduce`` with :class:`~cwlens.reducers.TopK` and :class:`~cwlens.reducers.ColumnSums`
of the contribution and the three attention baselines (the benchmark's, the CLI's and
``cwlens.explain``'s reducers) would, per block, compute the contribution's
``[batch, head, q, key]`` tensor (one product of QKᵀ's size, then a pass by ``a``), check
it, sum its columns and the pattern's, and rank each row of three metrics: eight passes
over the block. :func:`cwlens.engine.native.block_measures` (``block_measures.c``) does all
of it while a tile of rows is in the cache, writing nothing of the block's size; its lists
and sums go into the block's shared ``weights.derived``, where the reducers look first
(:func:`cwlens.engine.row_topk.shared_row_topk`, ``ColumnSums``), so they are unchanged.

It applies on the CPU to float32 blocks whose keys are one run per query and text (causal,
sliding windows, padding at either end); anything else, a reducer asking other options
(``by_abs``, ``sum_heads`` top-k, other metrics) and any block with a non-finite
contribution go the torch way as before (which names the layer and heads).
``CWLENS_NATIVE=0`` turns it off (:func:`cwlens.engine.native.available`); tests compare
both paths (``tests/test_block_fused.py``).
"""

from dataclasses import dataclass

import torch

from cwlens.engine import native
from cwlens.engine.reducers import ColumnSums, TopK
from cwlens.engine.row_topk import block_key_ranges

_VWON = "value_weighted_output_normalized"
_SUMMED = ("contribution", "attention", "value_weighted", _VWON)


@dataclass(frozen=True)
class Plan:
    """What the reducers of one run ask of every block: top-k lists (``ks``: every ``k``
    asked, ranked once at the largest) of ``topk`` metrics, and whether column sums."""

    topk: tuple[str, ...]
    ks: tuple[int, ...]
    column_sums: bool
    contribution: bool


def plan_of(reducers) -> Plan | None:
    """The :class:`Plan` of a run's reducers, or None where none asks what the kernel gives."""
    topk: set[str] = set()
    ks: set[int] = set()
    sums = contribution = False
    for r in reducers:
        if type(r) is TopK and not r.by_abs and not r.sum_heads and r.metric in _SUMMED:
            metric = "value_weighted" if r.metric == _VWON else r.metric  # same row order
            topk.add(metric)
            ks.add(r.k)
            contribution |= metric == "contribution"
        elif type(r) is ColumnSums and r.metric in _SUMMED:
            sums = True
            contribution |= r.metric == "contribution"
    if not topk and not sums:
        return None
    order = tuple(m for m in native.TOPK_METRICS if m in topk)
    return Plan(order, tuple(sorted(ks)), sums, contribution)


def _usable(geo) -> bool:
    p = geo.pattern
    return (p.dtype == torch.float32 and p.device.type == "cpu" and p.stride(-1) == 1
            and geo.v.dtype == torch.float32 and native.available())


class LayerPanels:
    """One layer's values as the kernel reads them (:func:`cwlens.engine.native.value_panels`),
    made from the first block that needs them (the widest: blocks come widest first) and
    remade only for a wider one."""

    def __init__(self):
        self.panels: list[torch.Tensor] | None = None
        self.width = 0

    def of(self, geo) -> list[torch.Tensor]:
        width = geo.v.shape[1]
        if self.panels is None or self.width < width:
            self.panels = [native.value_panels(geo.v[i]) for i in range(geo.v.shape[0])]
            self.width = width
        return self.panels


def fill(weights, plan: Plan | None, panels: LayerPanels) -> bool:
    """Compute ``plan`` for the block of ``weights`` (a ``BlockMeasures``) in one C call per
    text and put the results where the reducers look; False (nothing filled) where the
    kernel does not apply or found a non-finite contribution."""
    geo = getattr(weights, "geometry", None)
    if plan is None or geo is None or not _usable(geo):
        return False
    b, h, q, width = geo.pattern.shape
    ranges = block_key_ranges(weights)
    if ranges is None:
        return False
    kind = weights.kind
    inv1 = geo.inverse_norm(kind, 1).to(torch.float32)  # [b, 1 or h, q]
    d = geo.v.shape[-1]
    values: list[torch.Tensor | None]
    if plan.contribution:
        proj = geo.projection(kind)[0]  # [b, q, h, d]
        u = (proj * geo.inverse_norm(kind, 2).permute(0, 2, 1)[..., None]).permute(0, 2, 1, 3)
        values = list(panels.of(geo))
    else:  # nothing reads them
        u, values = geo.pattern.new_zeros(b, h, q, d), [None] * b
    u = u.to(torch.float32)
    k = max(plan.ks, default=1)
    parts = []
    for i in range(b):
        lo, hi = ranges[0] if len(ranges) == 1 else ranges[i]
        inputs = native.BlockInputs(geo.pattern[i], u[i], values[i], geo.value_norm[i], inv1[i], lo, hi)
        out = native.block_measures(inputs, k, plan.topk, plan.column_sums, plan.contribution)
        if out is None:
            return False  # a contribution is not finite: torch computes it and names it
        parts.append(out)
    cache = weights.derived
    n_keys = getattr(weights, "n_keys", None)
    for metric in plan.topk:
        idx = torch.stack([p[0][metric][0] for p in parts])
        val = torch.stack([p[0][metric][1] for p in parts])
        for kk in plan.ks:  # the k best of the largest k's lists: the same ranking, cut
            n_out = min(kk, width if n_keys is None else max(n_keys, width))
            cache[("row_topk", metric, kk, False, False)] = (_cut(idx, n_out, -1), _cut(val, n_out, float("nan")))
    if plan.column_sums:
        cols = torch.stack([p[1] for p in parts if p[1] is not None], 1)  # [3, b, h, width]
        norm = geo.value_norm.to(torch.float32)
        cache[("column_sums", "attention")] = cols[1]
        cache[("column_sums", "value_weighted")] = cols[1] * norm
        cache[("column_sums", _VWON)] = cols[2] * norm
        if plan.contribution:
            cache[("column_sums", "contribution")] = cols[0]
    return True


def _cut(x: torch.Tensor, n: int, fill_value) -> torch.Tensor:
    """The first ``n`` of the last axis (padded with ``fill_value`` where it is shorter)."""
    if x.shape[-1] >= n:
        return x[..., :n].contiguous()
    extra = x.new_full((*x.shape[:-1], n - x.shape[-1]), fill_value)
    return torch.cat([x, extra], -1)
