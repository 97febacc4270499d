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


def shared_row_topk(weights, metric: str, k: int, by_abs: bool, sum_heads: bool, n_keys: int | None):
    """:func:`_row_topk` of one block's measure, computed once per block for every reducer
    that asks the same (e.g. ``TopK(8, "value_weighted")`` and the output-normalised
    baseline, which ranks by it)."""
    cache = getattr(weights, "derived", None)
    key = ("row_topk", metric, k, by_abs, sum_heads)
    if cache is not None and key in cache:
        return cache[key]
    w = weights[metric]
    if sum_heads:
        w = w.sum(1, keepdim=True)
    idx, val = _row_topk(w, k, by_abs, n_keys)
    out = idx.int(), val  # int32 once: the reducers sharing it hold one copy
    if cache is not None:
        cache[key] = out
    return out


def _row_topk(w: torch.Tensor, k: int, by_abs: bool, n_keys: int | None):
    """Top-k of each row of ``w`` ``[..., width]``, as if the row went on with zeros up to
    ``n_keys`` (a causal block's keys after its last query are 0 in every measure)."""
    width = w.shape[-1]
    n_keys = width if n_keys is None else n_keys
    score = w.abs() if by_abs else w
    idx = _topk_indices(score, k)
    val = w.gather(-1, idx)
    n_zero = min(k, n_keys - width)
    # the zeros after the block compete where a row has fewer than k entries or a negative
    # one among its k largest (|w| ranks a zero last, and a tie may pick either index)
    if n_zero > 0 and (idx.shape[-1] < k or (not by_abs and bool((val[..., -1] < 0).any()))):
        zero_idx = torch.arange(width, width + n_zero, device=w.device).expand(*w.shape[:-1], n_zero)
        idx = torch.cat([idx, zero_idx], -1)
        val = torch.cat([val, torch.zeros(zero_idx.shape, dtype=w.dtype, device=w.device)], -1)
        keep = (val.abs() if by_abs else val).topk(min(k, idx.shape[-1]), dim=-1).indices
        idx, val = idx.gather(-1, keep), val.gather(-1, keep)
    return idx, val
