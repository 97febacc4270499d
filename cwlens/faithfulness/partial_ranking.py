"""A row-scope ranking exact only where masks need it: the ``top`` best and ``bottom``
worst eligible entries of each row.

A mask of rate ``r`` removes ``k = round_half_up(r * n)`` entries of each row: the ``k``
best-ranked (comprehensiveness) or the ``k`` worst-ranked (sufficiency). When the largest
``k`` of every job is small next to the row (say ``--rates 0.3 --modes
comprehensiveness``), sorting every entry of every row is mostly wasted: two ``topk``
selections of the same int64 keys (score, then the seeded tie-break: the order of
:func:`~cwlens.faithfulness.ranking.rank_entries`) give the same masks for less (on rows of 16384 keys the whole
ranking took 1/2.0 of the sort's CPU time for masks of 30% of a row, 1/2.8 for 10%, 1/3.7
for 1%: ``python scripts/benchmark.py --ranking --lengths 4096 16384``).

The ranks it returns: the ``top + 1`` best entries ``0..top`` and the ``bottom + 1`` worst
``n - 1 - bottom..n - 1`` exactly as the full ranking gives them; every other eligible entry
``top + 1`` (between the two blocks: no mask of at most ``top`` / ``bottom`` entries
takes it); ineligible entries the row width (``>= n``, as in the full ranking). Equal keys
(equal score *and* equal tie-break draw) are ordered by key position in the full ranking
but arbitrarily by ``topk``: where two such keys sit next to each other inside either
block, this returns None and the caller sorts.
"""

import torch

from cwlens.faithfulness.ranking import Ranking, order_keys

# the selections beat the stable sort while top + bottom stays under this share of a row
PARTIAL_UP_TO = 0.4
_HIGHEST = torch.iinfo(torch.int64).max


def worth_it(top: int, bottom: int, width: int) -> bool:
    """Whether :func:`rank_rows_partially` is cheaper than a sort for these depths."""
    return top + bottom + 2 <= PARTIAL_UP_TO * width


def rank_rows_partially(scores: torch.Tensor, eligible: torch.Tensor, tiebreak: torch.Tensor,
                        top: int, bottom: int) -> Ranking | None:
    """A row-scope :class:`~cwlens.faithfulness.ranking.Ranking` of ``scores`` ``[batch,
    head, query, key]`` whose masks of at most ``top`` (comprehensiveness) and ``bottom``
    (sufficiency) entries per row equal the full ranking's; None where equal keys make the
    selections ambiguous (then rank with ``rank_entries``)."""
    b, h, q, width = scores.shape
    elig = eligible.expand(b, h, q, width)
    n = elig.sum(-1, keepdim=True)
    key = order_keys(scores.float().masked_fill(~elig, float("-inf")),
                     tiebreak.to(scores.device).float().expand(b, h, q, width))
    rank = torch.where(elig, top + 1, width).to(torch.int32)
    if top > 0:  # (no mask takes from an end of depth 0: its block is not needed)
        n_top = min(top + 1, width)
        top_key, top_at = key.topk(n_top, dim=-1)  # best first
        pos = torch.arange(n_top, device=scores.device)
        if _adjacent_ties(top_key, pos, n):
            return None
        rank.scatter_(-1, top_at, torch.where(pos < n, pos, width).to(torch.int32))
    if bottom > 0:
        n_bottom = min(bottom + 1, width)
        key.masked_fill_(~elig, _HIGHEST)  # ineligible entries are never among the worst
        bottom_key, bottom_at = key.topk(n_bottom, dim=-1, largest=False)  # worst first
        pos = torch.arange(n_bottom, device=scores.device)
        if _adjacent_ties(bottom_key, pos, n):
            return None
        rank.scatter_(-1, bottom_at, torch.where(pos < n, n - 1 - pos, width).to(torch.int32))
    return Ranking(rank, n.to(torch.int64), "row", depth=(top, bottom))


def _adjacent_ties(keys: torch.Tensor, pos: torch.Tensor, n: torch.Tensor) -> bool:
    """Two equal keys next to each other among a selection's eligible entries."""
    return bool(((keys[..., 1:] == keys[..., :-1]) & (pos[1:] < n)).any())
