"""RowCutCounts (the counts of a row-scope mask from the ranked scores) equals the
definition, ranking.mask_counts on the masks themselves: ties at the cut, padding,
sliding windows, the first token kept, every rate including 0 and 1, both modes."""

import pytest
import torch

from cwlens.faithfulness.cut_counts import RowCutCounts
from cwlens.faithfulness.ranking import mask_counts, rank_entries

from ._ranking_cases import tied_rows

RATES = (0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 0.95, 0.99, 1.0)


def _case(seed, levels, mask_first, window):
    n = 17
    scores, eligible, tb, first = tied_rows(seed, levels, mask_first, window, n)
    ranking = rank_entries(scores, eligible, "row", tb)
    return scores, eligible, ranking, first, (3, 2, n, n)


@pytest.mark.parametrize("seed, levels", [(0, 2), (1, 3), (2, 7), (3, 1000)])
@pytest.mark.parametrize("mask_first, window", [(True, None), (False, None), (True, 4)])
@pytest.mark.parametrize("mode", ["comprehensiveness", "sufficiency"])
def test_row_cut_counts_equal_the_definition(seed, levels, mask_first, window, mode):
    scores, eligible, ranking, first, shape = _case(seed, levels, mask_first, window)
    fast = RowCutCounts(ranking, scores, first)
    for rate in RATES:
        removed = ranking.mask(rate, mode)
        expected = mask_counts(scores, eligible, removed, "row", first)
        assert torch.equal(fast.counts(rate, mode), expected), (rate, mode)


def test_ties_are_counted_at_all():
    """Guard against a vacuous pass: with two score levels the tie-break chooses entries."""
    scores, eligible, ranking, first, _ = _case(0, 2, True, None)
    c = RowCutCounts(ranking, scores, first).counts(0.3, "comprehensiveness")
    assert (c[:, 1] > 0).all() and (c[:, 2] > 0).all()


def test_head_scope_is_refused():
    scores, eligible, _, first, _ = _case(0, 2, True, None)
    head = rank_entries(scores, eligible, "head")
    with pytest.raises(ValueError, match="row-scope"):
        RowCutCounts(head, scores, first)
