"""The ends-only row ranking (cwlens.faithfulness.partial_ranking) gives the full ranking's
masks and counts for every mask it covers: ties at the cut, padding, sliding windows, the
first token kept, both modes; equal keys inside a block send the caller back to the sort;
job_masks uses it only where the jobs' masks are small, with the same masks."""

from types import SimpleNamespace

import pytest
import torch

from cwlens.faithfulness import job_masks as jm
from cwlens.faithfulness import partial_ranking
from cwlens.faithfulness.cut_counts import RowCutCounts
from cwlens.faithfulness.partial_ranking import rank_rows_partially
from cwlens.faithfulness.ranking import n_to_mask, rank_entries

from ._ranking_cases import tied_rows


def _case(seed, levels, mask_first, window, n=40):
    return tied_rows(seed, levels, mask_first, window, n)


@pytest.mark.parametrize("seed, levels", [(0, 2), (1, 3), (2, 7), (3, 1000)])
@pytest.mark.parametrize("mask_first, window", [(True, None), (False, None), (True, 4)])
@pytest.mark.parametrize("top, bottom", [(3, 0), (0, 5), (4, 4), (12, 2), (39, 39)])
def test_partial_masks_and_counts_equal_the_full_ranking(seed, levels, mask_first, window, top, bottom):
    scores, eligible, tb, first = _case(seed, levels, mask_first, window)
    full = rank_entries(scores, eligible, "row", tb)
    part = rank_rows_partially(scores, eligible, tb, top, bottom)
    assert part is not None  # the tie-break draws differ: no equal keys here
    assert not torch.equal(part.rank, full.rank) or top + bottom + 2 >= 40  # it is partial
    counts_full, counts_part = RowCutCounts(full, scores, first), RowCutCounts(part, scores, first)
    n_max = int(full.n_eligible.max())
    for mode, limit in [("comprehensiveness", top), ("sufficiency", bottom)]:
        for rate in torch.linspace(0, 1, 41).tolist():
            if int(n_to_mask(rate, torch.tensor(n_max))) > limit:
                with pytest.raises(ValueError, match="exact for"):
                    part.mask(rate, mode)
                continue
            assert torch.equal(part.mask(rate, mode), full.mask(rate, mode)), (rate, mode)
            assert torch.equal(counts_part.counts(rate, mode), counts_full.counts(rate, mode)), (rate, mode)


def test_equal_keys_inside_a_block_fall_back_to_the_sort():
    scores, eligible, tb, _ = _case(0, 2, True, None)
    tb = torch.zeros_like(tb)  # every tie-break draw equal: equal keys everywhere
    assert rank_rows_partially(scores, eligible, tb, 4, 4) is None


@pytest.mark.parametrize("rates, modes, partial", [
    ((0.1, 0.3), ("comprehensiveness",), True),
    ((0.05,), ("comprehensiveness", "sufficiency"), True),
    ((0.3, 0.9), ("sufficiency",), False),  # 90% of a row: the sort is cheaper
])
def test_job_masks_take_the_ends_only_where_masks_are_small(rates, modes, partial, monkeypatch):
    monkeypatch.setenv("CWLENS_NATIVE", "0")  # torch's ranking (the kernel: test_native_masks.py)
    scores, eligible, tb, first = _case(5, 7, True, None, n=60)
    jobs = [((m, r, mode), SimpleNamespace(metric=m, rate=r, mode=mode))
            for m in ("a", "b") for r in rates for mode in modes]
    jobs.append((("all", 1.0, "comprehensiveness"), SimpleNamespace(metric=None, rate=1.0, mode="comprehensiveness")))
    piece = jm.Piece(scores.shape, eligible, first, lambda m: scores if m == "a" else -scores, lambda: tb)
    used = []
    real = partial_ranking.rank_rows_partially
    monkeypatch.setattr(jm, "rank_rows_partially", lambda *a: used.append(1) or real(*a))
    counts: dict = {}
    got = {k: v.clone() for k, v in jm.job_masks(jobs, piece, "row", counts)}
    assert bool(used) == partial
    monkeypatch.setattr(partial_ranking, "PARTIAL_UP_TO", 0.0)  # the sort everywhere
    monkeypatch.setattr(jm, "worth_it", lambda *a: False)
    counts_sorted: dict = {}
    want = {k: v.clone() for k, v in jm.job_masks(jobs, piece, "row", counts_sorted)}
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert {k: v.tolist() for k, v in counts.items()} == {k: v.tolist() for k, v in counts_sorted.items()}
