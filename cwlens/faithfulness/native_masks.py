"""Row-scope masks of one metric's jobs from the C kernel (:func:`cwlens.engine.native.row_masks`):
the masks and counts :func:`~cwlens.faithfulness.job_masks.job_masks` makes by ranking
every row, without the ranking: each job's cut is selected, the mask written bit-packed.

The same order as :func:`~cwlens.faithfulness.ranking.rank_entries` (score, then the
seeded tie-break, then key position) and the same counts as
:class:`~cwlens.faithfulness.cut_counts.RowCutCounts` (tests/test_native_masks.py). Used
where it applies -- the kernel is built, CPU float32 scores, no eligible NaN, every row's
eligible keys one run (causal, a window, padding, the first token left out all are) --
and torch ranks everywhere else.
"""

from collections.abc import Sequence

import torch

from cwlens.core.bitmask import PackedMask
from cwlens.engine import native
from cwlens.faithfulness.ranking import n_to_mask

_MODES = {"comprehensiveness": 0, "sufficiency": 1}


def eligible_ranges(eligible: torch.Tensor, shape: Sequence[int]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``(lo, hi, n)`` int64 ``[b, e, q]`` (``e``: 1 or the heads, as ``eligible``): each
    row's eligible keys are ``lo <= j < hi``, ``n`` of them; None where a row's eligible
    keys are not one run."""
    b, h, q, w = shape
    e = eligible.shape[1] if eligible.dim() == 4 else 1
    if e not in (1, h):
        return None
    el = eligible.bool().expand(b, e, q, w)
    runs = el[..., 0].long() + (el[..., 1:] & ~el[..., :-1]).sum(-1)
    if bool((runs > 1).any()):
        return None
    n = el.sum(-1)
    lo = el.to(torch.uint8).argmax(-1)  # the first eligible key (0 in an empty row: n = 0)
    return lo, lo + n, n


def row_masks_of(jobs: Sequence[tuple], scores: torch.Tensor, tiebreak: torch.Tensor,
                 eligible: torch.Tensor, first_key: torch.Tensor, ranges=None) -> dict | None:
    """``{job key: (PackedMask, counts int64 [batch, 3])}`` for ``jobs`` (``(key, job)``
    with ``.rate``, ``.mode``, one metric) over ``scores`` ``[b, h, q, w]``, or None where
    the kernel does not apply (then rank with torch). ``ranges``: :func:`eligible_ranges`
    of ``eligible``, where the caller has it (one piece's metrics share it)."""
    if scores.dim() != 4 or scores.dtype != torch.float32 or scores.device.type != "cpu":
        return None
    if not native.available():
        return None
    shape = tuple(scores.shape)
    if ranges is None:
        ranges = eligible_ranges(eligible, shape)
    if ranges is None:
        return None
    lo, hi, n = ranges
    b = shape[0]
    first = first_key.reshape(first_key.shape[0], -1).expand(b, -1)
    first_at = torch.where(first.any(-1), first.to(torch.uint8).argmax(-1), -1)
    ks = torch.stack([n_to_mask(job.rate, n) for _, job in jobs])
    out = native.row_masks(scores, tiebreak.to(scores.device), lo, hi, first_at,
                           [_MODES[job.mode] for _, job in jobs], ks)
    if out is None:  # an eligible score is NaN
        return None
    bits, counts = out
    per_sample = counts.sum((2, 3), dtype=torch.int64)  # [jobs, b, 3]
    return {key: (PackedMask(bits[i], shape), per_sample[i]) for i, (key, _) in enumerate(jobs)}
