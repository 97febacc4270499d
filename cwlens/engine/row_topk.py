"""Top-k of each row of a block of attention measures, for :class:`cwlens.reducers.TopK`:
``torch.topk``, or for long rows a grouped top-k (the k best strided groups' maxima, then
their keys); one top-k per block and request, shared by the reducers that ask the same."""

import torch

from cwlens.core.geometry import MEASURES
from cwlens.core.numerics import check_finite
from cwlens.engine import native

COLUMNS = 512  # strided groups of the grouped top-k (key j is in group j % COLUMNS)
GROUPED_FROM = 2048  # row widths from which it beats torch.topk (scripts/benchmark.py --topk)


def _grouped_topk_indices(score: torch.Tensor, k: int, columns: int = COLUMNS) -> torch.Tensor:
    """Indices of the ``k`` largest entries of each row, as ``score.topk(k)`` (ties may pick
    other indices; needs ``k <= columns <= width``). Key ``j`` of the first
    ``width - width % columns`` is in group ``j % columns``: the group maxima are one
    elementwise maximum over the row's ``width // columns`` slices (no per-row work), the
    ``k`` largest entries lie in the ``k`` groups with the largest maxima, so a row costs
    that pass plus a top-k of ``columns`` maxima and one of ``k * width // columns`` keys
    (and the ragged tail)."""
    width = score.shape[-1]
    slices = width // columns
    main = slices * columns
    grid = score[..., :main].unflatten(-1, (slices, columns))  # [..., slice, column]
    best = grid.amax(-2).topk(k, dim=-1).indices  # [..., k] columns
    cand = grid.gather(-1, best[..., None, :].expand(*best.shape[:-1], slices, k)).flatten(-2)
    if main < width:
        cand = torch.cat([cand, score[..., main:]], -1)
    j = cand.topk(k, dim=-1).indices  # candidate j: slice j // k, column best[j % k], or the tail
    in_grid = j < slices * k
    column = best.gather(-1, j % k)
    return torch.where(in_grid, j.div(k, rounding_mode="floor") * columns + column, j - slices * k + main)


def _topk_indices(score: torch.Tensor, k: int) -> torch.Tensor:
    width = score.shape[-1]
    if width >= max(GROUPED_FROM, 2 * COLUMNS) and COLUMNS >= k and not score.is_cuda:
        return _grouped_topk_indices(score, k, COLUMNS)
    return score.topk(min(k, width), dim=-1).indices


def allowed_keys(weights, block, query_start: int) -> torch.Tensor | None:
    """``[batch or 1, 1, q, width]`` bool for one block of ``q`` queries (the first at
    position ``query_start``) and ``width`` keys: True where the query may attend to the key.
    A key is left out when it is padding or its query is (``block.position_mask``), after
    the query on a decoder (``weights.causal``), or outside a sliding-window layer's window
    (``weights.window``: query ``i`` sees keys ``i - window < j <= i``). None where every
    key is allowed. Computed once per block and shared by the reducers (``weights.derived``)."""
    cache = getattr(weights, "derived", None)
    if cache is not None and "allowed_keys" in cache:
        return cache["allowed_keys"]
    q, width, device = block.pattern.shape[-2], block.pattern.shape[-1], block.pattern.device
    causal, window = getattr(weights, "causal", False), getattr(weights, "window", None)
    allowed = None
    if causal:
        pos = torch.arange(query_start, query_start + q, device=device)[:, None]
        key = torch.arange(width, device=device)[None, :]
        allowed = key <= pos
        if window is not None:
            allowed = allowed & (key > pos - window)
        allowed = allowed[None, None]
    mask = getattr(block, "position_mask", None)
    if mask is not None:
        m = mask.to(device).bool()
        real = m[:, None, query_start : query_start + q, None] & m[:, None, None, :width]
        allowed = real if allowed is None else allowed & real
    if cache is not None:
        cache["allowed_keys"] = allowed
    return allowed


def shared_row_topk(weights, metric: str, k: int, by_abs: bool, sum_heads: bool, n_keys: int | None,
                    allowed=None):
    """:func:`_row_topk` of one block's measure, computed once per block for every reducer
    that asks the same (e.g. ``TopK(8, "value_weighted")`` and the output-normalised
    baseline, which ranks by it); ``allowed``: :func:`allowed_keys` of the block, or a
    function returning it (called only where torch ranks). On the CPU, where the C kernel
    is built, :func:`_native_row_topk` ranks instead (same lists)."""
    cache = getattr(weights, "derived", None)
    key = ("row_topk", metric, k, by_abs, sum_heads)
    if cache is not None and key in cache:
        return cache[key]
    out = None if sum_heads else _native_row_topk(weights, metric, k, by_abs, n_keys)
    if out is None:
        w = weights[metric]
        if sum_heads:
            w = w.sum(1, keepdim=True)
        idx, val = _row_topk(w, k, by_abs, n_keys, allowed() if callable(allowed) else allowed)
        out = idx.int(), val  # int32 once: the reducers sharing it hold one copy
    if cache is not None:
        cache[key] = out
    return out


def _native_row_topk(weights, metric: str, k: int, by_abs: bool, n_keys: int | None):
    """The block's top-k lists from :func:`cwlens.engine.native.row_topk`, or None where it
    does not apply (not built or ``CWLENS_NATIVE=0``, not a float32 CPU block, a padding
    mask whose real tokens are not one run per text). The keys a query attends to are one range per text and query
    (causal: up to the query; a sliding window: after ``query - window``; padding: the
    text's real tokens, none for a pad query); the value-weighted baseline is ranked as
    ``pattern x ||v~||`` without making its tensor."""
    geo = getattr(weights, "geometry", None)
    if geo is None:
        return None

    pattern = geo.pattern
    if pattern.dtype != torch.float32 or pattern.device.type != "cpu" or not native.available():
        return None
    q, width = pattern.shape[-2:]
    ranges = block_key_ranges(weights)
    if ranges is None:
        return None
    n_out = min(k, width if n_keys is None else max(n_keys, width))
    scale = None
    if metric == "value_weighted" and metric not in weights:
        x, scale = pattern, geo.value_norm  # [b, h, q, width] and [b, h, width]
        # the pattern is checked, a <= 1: only ||v~|| can make a product non-finite
        check_finite(scale, "the value_weighted weights", geo.layer, head_dim=1,
                     fix="The inputs are finite, so ||v~||^2 overflowed: run the model in "
                     "float64 (model.to(torch.float64)) or check the values' and W_O's scale.")
    else:
        x = weights[metric]
        if x.dtype != torch.float32 or x.dim() != 4:
            return None
        if metric not in MEASURES and not bool(torch.isfinite(x.sum())):
            return None  # a metric of one's own, unchecked, with NaN or inf: torch ranks it
    if len(ranges) == 1:  # the same ranges for every text: one call
        idx, val = native.row_topk(x, n_out, by_abs, scale, *ranges[0])
    else:  # a padded batch: one call per text, with its own ranges
        parts = [native.row_topk(x[i : i + 1], n_out, by_abs, None if scale is None else scale[i : i + 1],
                                 *ranges[i]) for i in range(len(ranges))]
        idx, val = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    if by_abs:  # the kernel ranked |.|: the values keep their sign
        safe = idx.long().clamp_min(0)
        signed = x.gather(-1, safe)
        if scale is not None:
            signed = signed * scale[:, :, None, :].expand_as(x).gather(-1, safe)
        val = signed.masked_fill(idx < 0, float("nan"))
    return idx, val


def block_key_ranges(weights):
    """:func:`_key_ranges` of the block of ``weights`` (a ``BlockMeasures``), computed once
    and shared (``weights.derived``) by every kernel that ranks or reads the block."""
    geo = weights.geometry
    cache = getattr(weights, "derived", None)
    if cache is not None and "key_ranges" in cache:
        return cache["key_ranges"]
    q, width = geo.pattern.shape[-2:]
    ranges = _key_ranges(geo, q, width, getattr(weights, "causal", False), getattr(weights, "window", None))
    if cache is not None:
        cache["key_ranges"] = ranges
    return ranges


def _key_ranges(geo, q: int, width: int, causal: bool, window: int | None):
    """``[(lo, hi)]``, one pair of ``[q]`` int64 tensors per text (one pair for all where
    there is no padding mask): query ``i`` of the block attends to keys ``lo[i] <= j <
    hi[i]``. None where a text's real tokens are not one run (a mask with holes)."""
    pos = torch.arange(geo.query_start, geo.query_start + q)
    mask = geo.position_mask
    runs = [(0, width)] if mask is None else []
    if mask is not None:
        m = mask.cpu().bool()
        for row in m:
            real = row.nonzero().flatten()
            first, last = int(real[0]), int(real[-1])
            if int(real.numel()) != last - first + 1:
                return None  # real tokens with pad tokens between them
            runs.append((first, last + 1))
    out = []
    for first, stop in runs:
        lo = torch.full((q,), first, dtype=torch.int64)
        hi = torch.full((q,), min(stop, width), dtype=torch.int64)
        if causal:
            hi = torch.minimum(hi, pos + 1)
            if window is not None:
                lo = torch.maximum(lo, pos - window + 1)
        if mask is not None:  # a pad query attends to nothing
            hi = torch.where((pos >= first) & (pos < stop), hi, lo)
        out.append((lo, torch.maximum(hi, lo)))
    return out


def _row_topk(w: torch.Tensor, k: int, by_abs: bool, n_keys: int | None,
              allowed: torch.Tensor | None = None):
    """Top-k of each row of ``w`` ``[..., width]`` among the keys ``allowed`` (broadcast to
    ``w``; None: every key), ``min(k, n_keys)`` entries a row, sorted from the largest.

    A key left out (padding, after the query, outside the window, or past ``width``: a
    causal block stops at its last query) is never a result: where a row has fewer keys
    than that, its last entries are marked with index -1 and value NaN. The plain top-k is
    taken first; only a block where it picked a key left out is ranked again with those
    keys at -inf, and only its query rows where it did (a causal run: the first ``k``
    queries), so a long row costs what ``torch.topk`` costs."""
    width = w.shape[-1]
    n_out = min(k, width if n_keys is None else max(n_keys, width))
    score = w.abs() if by_abs else w
    idx = _topk_indices(score, min(n_out, width))
    ok = None
    if allowed is not None:
        allowed = allowed.expand(w.shape)
        ok = allowed.gather(-1, idx)
        redo = (~ok).flatten(0, -3).any(-1).any(0) if ok.ndim > 2 else (~ok).any(-1)  # [query]
        if bool(redo.any()):
            rows, q_dim = redo.nonzero().flatten(), w.ndim - 2
            again = score.index_select(q_dim, rows).masked_fill(
                ~allowed.index_select(q_dim, rows), float("-inf"))
            idx = idx.index_copy(q_dim, rows, _topk_indices(again, min(n_out, width)))
            ok = allowed.gather(-1, idx)
    val = w.gather(-1, idx)
    if ok is not None and not bool(ok.all()):
        idx = idx.masked_fill(~ok, -1)
        val = val.masked_fill(~ok, float("nan"))
    if idx.shape[-1] < n_out:  # fewer keys than k in the block: the rest are marked
        extra = (*idx.shape[:-1], n_out - idx.shape[-1])
        idx = torch.cat([idx, idx.new_full(extra, -1)], -1)
        val = torch.cat([val, val.new_full(extra, float("nan"))], -1)
    return idx, val
