"""Rankings -> masks (unit tier, no model): exact counts per scope, modes, the random control."""

import math

import pytest
import torch

from cwlens.faithfulness.ranking import (
    eligible_entries,
    n_to_mask,
    random_scores,
    rank_entries,
)
from cwlens.testing import random_layer


def batch(seed=0):
    pattern, _, _ = random_layer(batch=3, n_heads=4, n_kv=2, pos=9, seed=seed)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    mask[2, :5] = 0
    return torch.randn(pattern.shape, generator=torch.Generator().manual_seed(seed)), mask


def units(t: torch.Tensor, scope: str) -> torch.Tensor:
    """Per-unit sums of a [b, h, q, k] tensor."""
    return {"row": lambda: t.sum(-1), "head": lambda: t.sum((-2, -1)),
            "layer": lambda: t.sum((-3, -2, -1))}[scope]()


@pytest.mark.parametrize("scope", ["row", "head", "layer"])
@pytest.mark.parametrize("first", [True, False])
@pytest.mark.parametrize("rate", [0.0, 0.1, 0.25, 0.3, 0.5, 0.7, 1.0])
def test_masks_have_exactly_round_rate_n_entries_per_unit(scope, first, rate):
    scores, mask = batch()
    elig = eligible_entries(mask, mask_first_token=first)
    ranking = rank_entries(scores, elig, scope)
    e = elig.expand_as(scores)
    n = units(e.long(), scope)
    expected = torch.tensor([math.floor(rate * float(x) + 0.5) for x in n.flatten()]).view(n.shape)
    for mode in ("comprehensiveness", "sufficiency"):
        m = ranking.mask(rate, mode)
        assert not (m & ~e).any(), "an ineligible entry was masked"
        assert torch.equal(units(m.long(), scope), expected)


@pytest.mark.parametrize("scope", ["row", "head", "layer"])
def test_top_and_bottom_are_the_extremes(scope):
    scores, mask = batch(1)
    elig = eligible_entries(mask)
    ranking = rank_entries(scores, elig, scope)
    top, bottom = ranking.mask(0.3, "comprehensiveness"), ranking.mask(0.3, "sufficiency")
    assert not (top & bottom).any()
    e = elig.expand_as(scores)
    s = scores.masked_fill(~e, float("nan"))
    # every masked top entry scores at least every unmasked eligible entry of its unit
    if scope == "row":
        lo_top = s.masked_fill(~top, float("inf")).amin(-1)
        hi_rest = s.masked_fill(top | ~e, float("-inf")).amax(-1)
        assert (lo_top >= hi_rest).all()
        hi_bot = s.masked_fill(~bottom, float("-inf")).amax(-1)
        lo_rest = s.masked_fill(bottom | ~e, float("inf")).amin(-1)
        assert (hi_bot <= lo_rest).all()


@pytest.mark.parametrize("scope", ["row", "head", "layer"])
def test_comprehensiveness_at_rate_one_equals_sufficiency(scope):
    scores, mask = batch(2)
    elig = eligible_entries(mask)
    ranking = rank_entries(scores, elig, scope)
    full = ranking.mask(1.0, "comprehensiveness")
    assert torch.equal(full, ranking.mask(1.0, "sufficiency"))
    assert torch.equal(full, elig.expand_as(scores))
    assert not ranking.mask(0.0, "comprehensiveness").any()


def test_eligibility_causal_padding_first_token():
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    e = eligible_entries(mask)[0, 0]
    assert e.sum() == 6  # 3 real tokens, causal triangle
    assert not e[:2].any() and not e[:, :2].any()
    e = eligible_entries(mask, mask_first_token=False)[0, 0]
    assert e.sum() == 3 and not e[:, 2].any()
    assert eligible_entries(mask, causal_only=False)[0, 0].sum() == 9


def test_rounding_is_half_up():
    n = torch.tensor([5, 10, 3, 1])
    assert n_to_mask(0.5, n).tolist() == [3, 5, 2, 1]
    assert n_to_mask(0.3, n).tolist() == [2, 3, 1, 0]
    with pytest.raises(ValueError, match="rate"):
        n_to_mask(1.5, n)


def test_random_scores_do_not_depend_on_batch_or_padding():
    short = torch.tensor([[1, 1, 1]])
    padded = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    a = random_scores((1, 2, 3, 3), short, ["s0"], seed=7, layer=3)
    b = random_scores((2, 2, 5, 5), padded, ["s0", "s1"], seed=7, layer=3)
    assert torch.equal(a[0], b[0, :, 2:, 2:])
    assert not torch.equal(a, random_scores((1, 2, 3, 3), short, ["s0"], seed=8, layer=3))
