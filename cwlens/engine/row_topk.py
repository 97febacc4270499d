"""Top-k of each row of a block of attention measures, for :class:`cwlens.reducers.TopK`:
``torch.topk``, or for long rows a grouped top-k (the k best groups' maxima, then their
keys); one top-k per block and request, shared by the reducers that ask the same."""

import torch

GROUP = 64  # keys per group of the grouped top-k
GROUPED_FROM = 4096  # row widths from which it beats torch.topk (scripts/benchmark.py --topk)


def _grouped_topk_indices(score: torch.Tensor, k: int, group: int = GROUP) -> torch.Tensor:
    """Indices of the ``k`` largest entries of each row, as ``score.topk(k)`` (ties may pick
    other indices). The ``k`` largest entries lie in the ``k`` groups of ``group`` keys with
    the largest maxima, so only those groups (and the ragged tail) are ranked: a row of
    ``width`` keys costs one max pass plus a top-k of ``k * group`` entries."""
    width = score.shape[-1]
    main = width - width % group
    groups = score[..., :main].unflatten(-1, (main // group, group))
    best = groups.amax(-1).topk(k, dim=-1).indices  # [..., k]
    cand = groups.gather(-2, best[..., None].expand(*best.shape, group)).flatten(-2)
    if main < width:
        cand = torch.cat([cand, score[..., main:]], -1)
    j = cand.topk(k, dim=-1).indices  # candidate j: group slot j // group, or the tail
    in_group = j < k * group
    slot = j.div(group, rounding_mode="floor").clamp_(max=k - 1)
    return torch.where(in_group, best.gather(-1, slot) * group + j % group, j - k * group + main)


def _topk_indices(score: torch.Tensor, k: int) -> torch.Tensor:
    width = score.shape[-1]
    if width >= max(GROUPED_FROM, 2 * k * GROUP) and not score.is_cuda:
        return _grouped_topk_indices(score, k, GROUP)
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
                    allowed: torch.Tensor | None = None):
    """:func:`_row_topk` of one block's measure, computed once per block for every reducer
    that asks the same (e.g. ``TopK(8, "value_weighted")`` and the output-normalised
    baseline, which ranks by it); ``allowed``: :func:`allowed_keys` of the block."""
    cache = getattr(weights, "derived", None)
    key = ("row_topk", metric, k, by_abs, sum_heads)
    if cache is not None and key in cache:
        return cache[key]
    w = weights[metric]
    if sum_heads:
        w = w.sum(1, keepdim=True)
    idx, val = _row_topk(w, k, by_abs, n_keys, allowed)
    out = idx.int(), val  # int32 once: the reducers sharing it hold one copy
    if cache is not None:
        cache[key] = out
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
