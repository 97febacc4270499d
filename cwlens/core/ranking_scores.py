"""How well a score ranks the entries a ground truth marks: ROC AUC and precision at
``|truth|``, with ties handled exactly (pure torch, float64).

For scores ``s_1..s_N`` and labels ``y_1..y_N`` (``P`` positives, ``M = N - P``
negatives):

``auroc``
    the probability that a random positive outscores a random negative, ties counting
    one half (Mann-Whitney)::

        AUROC = ( #{(i, j): y_i, not y_j, s_i > s_j} + 0.5 #{... s_i = s_j} ) / (P M)

    computed from mid-ranks: ``AUROC = (R_+ - P (P + 1) / 2) / (P M)`` with ``R_+`` the
    sum of the positives' mid-ranks (ascending; tied scores share the mean of their ranks).
    A score that ties everything gets exactly 0.5; one that ranks every positive first, 1.
    NaN when ``P = 0`` or ``M = 0`` (no pair to compare).

``precision_at_k`` (``k = P`` by default: precision at ``|truth|``)
    the share of positives among the ``k`` top-scored entries. Where the ``k``-th place
    falls inside a group of tied scores, the group's places are filled at random: the
    result is the *expected* precision over that tie-breaking, ``(a + (k - m) p / g) / k``
    with ``a`` positives among the ``m`` entries scored above the tie, and ``p`` of the
    ``g`` tied entries positive. So a constant score gets ``P / N`` (chance), never the luck
    of an index order. At ``k = P`` precision equals recall (R-precision). NaN when
    ``k = 0``.

Non-finite scores are refused (a NaN has no rank): callers say where a measure is
undefined and leave those entries out first.
"""

import math

import torch

from cwlens.errors import InvalidArgumentError, NonFiniteError, ShapeMismatchError


def _flat(scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(scores, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise InvalidArgumentError(
            f"scores and labels must be tensors; got {type(scores).__name__} and "
            f"{type(labels).__name__}. Wrap them with torch.as_tensor(...).")
    if scores.shape != labels.shape:
        raise ShapeMismatchError(
            f"scores {list(scores.shape)} and labels {list(labels.shape)} must have the same "
            "shape: one label per scored entry.")
    s = scores.detach().reshape(-1).to(torch.float64).cpu()
    if not bool(torch.isfinite(s).all()):
        bad = int((~torch.isfinite(s)).sum())
        raise NonFiniteError(
            f"{bad} of {s.numel()} scores are NaN or infinite: they have no rank. Leave the "
            "entries where the measure is undefined out of the scoring (select with a mask).")
    return s, labels.detach().reshape(-1).to(torch.bool).cpu()


def midranks(scores: torch.Tensor) -> torch.Tensor:
    """1-based ascending ranks of a 1-d tensor, tied values sharing the mean of their
    ranks (float64)."""
    s = scores.reshape(-1).to(torch.float64)
    order = torch.argsort(s, stable=True)
    _, counts = torch.unique_consecutive(s[order], return_counts=True)
    ends = torch.cumsum(counts, 0).to(torch.float64)  # 1-based rank of each group's last
    mean_rank = ends - (counts.to(torch.float64) - 1) / 2
    ranks = torch.empty_like(s)
    ranks[order] = torch.repeat_interleave(mean_rank, counts)
    return ranks


def auroc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """ROC AUC of ``scores`` against the boolean ``labels`` (same shape; ties count one
    half; NaN without a positive or a negative). See the module docstring."""
    s, y = _flat(scores, labels)
    pos = int(y.sum())
    neg = y.numel() - pos
    if pos == 0 or neg == 0:
        return math.nan
    r_pos = float(midranks(s)[y].sum())
    return (r_pos - pos * (pos + 1) / 2) / (pos * neg)


def precision_at_k(scores: torch.Tensor, labels: torch.Tensor, k: int | None = None) -> float:
    """Expected share of positives among the ``k`` top-scored entries under random
    tie-breaking (``k`` defaults to the number of positives: precision at ``|truth|``;
    NaN when ``k`` is 0). See the module docstring."""
    s, y = _flat(scores, labels)
    if k is None:
        k = int(y.sum())
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= s.numel():
        raise InvalidArgumentError(
            f"k must be an int from 0 to the number of entries ({s.numel()}); got {k!r}.")
    if k == 0:
        return math.nan
    threshold = torch.sort(s, descending=True).values[k - 1]
    above = s > threshold
    tied = s == threshold
    m, a = int(above.sum()), int((above & y).sum())
    g, p = int(tied.sum()), int((tied & y).sum())
    return (a + (k - m) * p / g) / k


def _rows(scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(scores, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise InvalidArgumentError(
            f"scores and labels must be tensors; got {type(scores).__name__} and "
            f"{type(labels).__name__}. Wrap them with torch.as_tensor(...).")
    if scores.ndim != 2 or labels.shape != scores.shape[1:]:
        raise ShapeMismatchError(
            f"scores must be [rows, entries] and labels [entries]; got {list(scores.shape)} "
            f"and {list(labels.shape)}.")
    s = scores.detach().to(torch.float64).cpu()
    if not bool(torch.isfinite(s).all()):
        raise NonFiniteError(
            f"{int((~torch.isfinite(s)).sum())} of {s.numel()} scores are NaN or infinite: they "
            "have no rank. Leave the entries where a measure is undefined out first.")
    return s, labels.detach().to(torch.bool).cpu()


def midranks_rows(scores: torch.Tensor) -> torch.Tensor:
    """:func:`midranks` of every row of a ``[rows, entries]`` tensor at once."""
    s = scores.to(torch.float64)
    values, order = torch.sort(s, dim=-1, stable=True)
    n = s.shape[-1]
    idx = torch.arange(n).expand_as(values)
    first = torch.ones_like(values, dtype=torch.bool)
    first[:, 1:] = values[:, 1:] != values[:, :-1]
    last = torch.ones_like(values, dtype=torch.bool)
    last[:, :-1] = first[:, 1:]
    start = torch.where(first, idx, torch.zeros_like(idx)).cummax(-1).values
    end = torch.where(last, idx, torch.full_like(idx, n - 1)).flip(-1).cummin(-1).values.flip(-1)
    ranks = torch.empty_like(s)
    ranks.scatter_(-1, order, (start + end).to(torch.float64) / 2 + 1)
    return ranks


def auroc_rows(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """:func:`auroc` of every row of ``scores`` ``[rows, entries]`` against one ``labels``
    ``[entries]``: ``[rows]`` float64 (NaN without a positive or a negative)."""
    s, y = _rows(scores, labels)
    pos = int(y.sum())
    neg = y.numel() - pos
    if pos == 0 or neg == 0:
        return torch.full((s.shape[0],), math.nan, dtype=torch.float64)
    r_pos = midranks_rows(s)[:, y].sum(-1)
    return (r_pos - pos * (pos + 1) / 2) / (pos * neg)


def precision_rows(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """:func:`precision_at_k` at ``k = |truth|`` of every row of ``scores`` ``[rows,
    entries]``: ``[rows]`` float64 (NaN without a positive)."""
    s, y = _rows(scores, labels)
    k = int(y.sum())
    if k == 0:
        return torch.full((s.shape[0],), math.nan, dtype=torch.float64)
    threshold = torch.sort(s, dim=-1, descending=True).values[:, k - 1:k]
    above, tied = s > threshold, s == threshold
    a = (above & y).sum(-1).to(torch.float64)
    m = above.sum(-1).to(torch.float64)
    p = (tied & y).sum(-1).to(torch.float64)
    g = tied.sum(-1).to(torch.float64)
    return (a + (k - m) * p / g) / k
