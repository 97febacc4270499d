""":func:`~cwlens.faithfulness.ranking.mask_counts` of a row-scope ranking, read from the
ranked scores instead of the ``[batch, head, query, key]`` masks.

A row-scope mask removes, in each row with ``n`` eligible entries, the ``k`` best-ranked
(comprehensiveness) or the ``k`` worst-ranked (sufficiency) ones. With the row's scores
laid out in rank order (``ranked[r]`` = the score of the entry ranked ``r``, descending):

- removed entries: ``k`` per row;
- on the first token: the first key's rank falls inside the removed block;
- chosen by the tie-break: the removed entries scored like the cut, when the cut falls
  inside a block of equal scores -- comprehensiveness: ``ranked[k-1] == ranked[k]``, the
  removed ``j < k`` with ``ranked[j] == ranked[k-1]``; sufficiency: ``ranked[n-k-1] ==
  ranked[n-k]``, the removed ``j >= n-k`` with ``ranked[j] == ranked[n-k]``.

Each count is a few ``[batch, head, query]`` operations per condition instead of six
passes over the whole layer (``mask_counts`` took ~65% of the clean pass of a 10-metric,
10-rate sweep). The same numbers (tests/test_cut_counts.py).
"""

import torch

from cwlens.faithfulness.ranking import Ranking, n_to_mask


class RowCutCounts:
    """The counts of every ``(rate, mode)`` mask of one row-scope :class:`Ranking`.

    ``scores``: the scores it ranked (``[batch, head, query, key]``); ``first_key``: bool
    ``[batch, 1, 1, key]``, True at each row's first real token
    (:func:`~cwlens.faithfulness.ranking.first_token`).
    """

    def __init__(self, ranking: Ranking, scores: torch.Tensor, first_key: torch.Tensor):
        if ranking.scope != "row":
            raise ValueError(f"RowCutCounts needs a row-scope ranking; got scope={ranking.scope!r}.")
        rank = ranking.rank.long()
        width = rank.shape[-1]
        self.n = ranking.n_eligible  # [b, h, q, 1]
        scores = scores.float().expand(rank.shape)
        if ranking.depth is None:  # a permutation of 0..width-1
            ranked = torch.empty(rank.shape, dtype=torch.float32, device=rank.device)
            ranked.scatter_(-1, rank, scores)
        else:  # exact at both ends; the ranks between hold the score ranked `top` (with no
            # top block: the row's best), so that the row stays sorted (every entry between
            # scores at most that, at least the worst block's best); ineligible entries
            # (rank `width`) go to a spare column
            top = ranking.depth[0]
            if top > 0:
                fill = scores.gather(-1, (rank == top).int().argmax(-1, keepdim=True))
            else:
                fill = scores.masked_fill(rank >= width, float("-inf")).amax(-1, keepdim=True)
            ranked = fill.expand(*rank.shape[:-1], width + 1).contiguous()
            ranked.scatter_(-1, rank.clamp(max=width), scores)
            ranked = ranked[..., :width]
        beyond = torch.arange(width, device=rank.device) >= self.n  # ineligible ranks
        # the ranked scores negated (ascending, as searchsorted wants); ineligible ranks +inf
        self.ascending = (-ranked).masked_fill_(beyond, float("inf")).contiguous()
        first = first_key.int().argmax(-1, keepdim=True)  # [b, 1, 1, 1]
        self.first_rank = rank.gather(-1, first.expand(*rank.shape[:-1], 1))  # [b, h, q, 1]
        self.width = width

    def _at(self, pos: torch.Tensor) -> torch.Tensor:
        """The score ranked ``pos`` (-inf beyond the eligible ones)."""
        return -self.ascending.gather(-1, pos.clamp(0, self.width - 1))

    def counts(self, rate: float, mode: str) -> torch.Tensor:
        """int64 ``[batch, 3]``: removed, chosen by the tie-break, on the first token."""
        n = self.n
        k = n_to_mask(rate, n)
        if mode == "comprehensiveness":
            cut, other = k - 1, k  # last removed, first kept
            tie = (k >= 1) & (k < n) & (self._at(cut) == self._at(other))
            start = torch.searchsorted(self.ascending, -self._at(cut), side="left")
            tied = torch.where(tie, k - start, 0)
            first = self.first_rank < k
        else:
            cut, other = n - k, n - k - 1  # first removed, last kept
            tie = (k >= 1) & (k < n) & (self._at(cut) == self._at(other))
            end = torch.searchsorted(self.ascending, -self._at(cut), side="right").clamp(max=n)
            tied = torch.where(tie, end - cut, 0)
            first = (self.first_rank >= n - k) & (self.first_rank < n)
        per_sample = [k.sum((1, 2, 3)), tied.sum((1, 2, 3)), first.sum((1, 2, 3))]
        return torch.stack(per_sample, -1).to(torch.int64)
