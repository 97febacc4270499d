"""The masks of a set of mask jobs over one piece of a layer: a whole layer
(:func:`cwlens.faithfulness.passes.layer_masks`) or a block of query rows
(:mod:`cwlens.faithfulness.lockstep`). One rule for both paths:

- a job of rate 1 (``metric`` None) removes every eligible entry;
- every other job ranks by its metric with the seeded tie-break
  (:func:`~cwlens.faithfulness.ranking.rank_entries`), each metric ranked once and shared
  by the jobs that use it; at row scope, when those jobs remove few entries a row, only
  the ends of each row are ranked (:mod:`~cwlens.faithfulness.partial_ranking`, the same
  masks); head/layer scopes are made causal where asked
  (:func:`~cwlens.faithfulness.causal_scope.causal_ranking`);
- the counts (removed, chosen by the tie-break, on the first token) are added to
  ``counts[job key]``, read from the ranked scores at row scope
  (:class:`~cwlens.faithfulness.cut_counts.RowCutCounts`), from the mask otherwise.
"""

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch

from cwlens.core._types import Scope
from cwlens.engine import native
from cwlens.faithfulness import native_masks
from cwlens.faithfulness.causal_scope import causal_ranking
from cwlens.faithfulness.cut_counts import RowCutCounts
from cwlens.faithfulness.partial_ranking import rank_rows_partially, worth_it
from cwlens.faithfulness.ranking import add_counts, mask_counts, n_to_mask, rank_entries


class Piece(NamedTuple):
    """The entries being ranked: ``shape`` ``[batch, head, query, key]``, ``eligible``
    (broadcasts to it), ``first_key`` (bool ``[batch, 1, 1, key]``,
    :func:`~cwlens.faithfulness.ranking.first_token`), ``scores_of(metric)`` (its scores of
    a metric) and ``tiebreak_of()`` (its tie-break scores, drawn once, on the first ranked
    job)."""

    shape: Sequence[int]
    eligible: torch.Tensor
    first_key: torch.Tensor
    scores_of: Callable[[str], torch.Tensor]
    tiebreak_of: Callable[[], torch.Tensor]


def job_masks(jobs: Sequence[tuple], piece: Piece, scope: Scope, counts: dict | None,
              causal: bool = False) -> Iterator[tuple[object, torch.Tensor]]:
    """Yield ``(job key, mask [batch, head, query, key])`` (bool, or a
    :class:`~cwlens.core.bitmask.PackedMask` from the C kernel) for each ``(key, job)`` of
    ``jobs`` (jobs with ``.metric``, ``.rate``, ``.mode``) over ``piece``.

    ``counts`` None: nothing counted. ``causal``: head/layer scopes decided from rows
    ``<= i``. A metric's ranking lives until the generator is exhausted.
    """
    shape, eligible, first_key = piece.shape, piece.eligible, piece.first_key
    ranked: dict = {}
    tiebreak = None
    ranges: list = []  # the kernel's eligible ranges of this piece, computed once (native_masks)
    for key, job in jobs:
        if job.metric is None:  # rate 1: every eligible entry
            removed = eligible.expand(shape)
            add_counts(counts, key, mask_counts(None, eligible, removed, scope, first_key))
            yield key, removed
            continue
        if job.metric not in ranked:
            if tiebreak is None:
                tiebreak = piece.tiebreak_of()
            ranked[job.metric] = _rank(job.metric, jobs, piece, scope, tiebreak, counts, causal, ranges)
        done = ranked[job.metric]
        if isinstance(done, dict):  # the C kernel's masks and counts
            removed, c = done[key]
            add_counts(counts, key, c)
            yield key, removed
            continue
        ranking, kept = done
        removed = ranking.mask(job.rate, job.mode)
        if isinstance(kept, RowCutCounts):
            add_counts(counts, key, kept.counts(job.rate, job.mode))
        elif counts is not None:
            add_counts(counts, key, mask_counts(kept, eligible, removed, scope, first_key))
        yield key, removed


def _rank(metric: str, jobs: Sequence[tuple], piece: Piece, scope: Scope, tiebreak: torch.Tensor,
          counts: dict | None, causal: bool, ranges: list):
    """One metric's ranking for its jobs: ``{job key: (PackedMask, counts)}`` from the C
    kernel at row scope where it applies (:mod:`~cwlens.faithfulness.native_masks`), else
    ``(Ranking, what the counts are read from)``."""
    shape, eligible = piece.shape, piece.eligible
    scores = piece.scores_of(metric)
    mine = [(k, j) for k, j in jobs if j.metric == metric]
    if scope == "row" and native.available():  # the C kernel: every job of this metric at once
        if not ranges:
            ranges.append(native_masks.eligible_ranges(eligible, shape))
        fast = native_masks.row_masks_of(mine, scores, tiebreak, eligible, piece.first_key,
                                         ranges[0]) if ranges[0] is not None else None
        if fast is not None:
            return fast
    ranking = None
    if scope == "row":  # the ends of each row only, where the jobs' masks are small
        top, bottom = _depths([j for _, j in mine], shape[-1])
        if worth_it(top, bottom, shape[-1]):
            ranking = rank_rows_partially(scores, eligible, tiebreak, top, bottom)
    if ranking is None:
        ranking = rank_entries(scores, eligible, scope, tiebreak)
    if causal:
        ranking = causal_ranking(ranking)
    kept: RowCutCounts | torch.Tensor | None
    if counts is None:
        kept = None
    elif ranking.scope == "row":  # the counts from the ranked scores (cut_counts)
        kept = RowCutCounts(ranking, scores, piece.first_key)
    else:
        kept = scores
    return ranking, kept


def _depths(jobs: Sequence, width: int) -> tuple[int, int]:
    """The most entries a row of ``width`` keys loses to these jobs' comprehensiveness and
    sufficiency masks (a row's count grows with its eligible entries, at most ``width``)."""
    most = {"comprehensiveness": 0, "sufficiency": 0}
    for job in jobs:
        k = int(n_to_mask(job.rate, torch.tensor(width)))
        most[job.mode] = max(most[job.mode], k)
    return most["comprehensiveness"], most["sufficiency"]
