"""Ties in the faithfulness rankings are broken by a seeded random order, not key order,
and every mask reports how many removed entries that order chose and how many sit on the
first token (issue 17, point 1). Brute-force references, no model but the tiny one."""

import itertools

import pytest
import torch

from cwlens.faithfulness.ranking import (
    eligible_entries,
    first_token,
    mask_counts,
    mask_shares,
    rank_entries,
    tiebreak_scores,
)


def _tied_scores(seed, b=2, h=3, n=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 3, (b, h, n, n), generator=g).float()  # many ties


def test_ties_follow_the_seeded_order_not_key_order():
    mask = torch.ones(2, 8, dtype=torch.bool)
    elig = eligible_entries(mask)
    zeros = torch.zeros(2, 3, 8, 8)
    ties = tiebreak_scores(zeros.shape, mask, ["a", "b"], seed=0, layer=0)
    removed = rank_entries(zeros, elig, "row", ties).mask(0.5, "comprehensiveness")
    by_key = rank_entries(zeros, elig, "row").mask(0.5, "comprehensiveness")
    assert by_key[..., 0].all()  # key order: the first token (the sink) always goes first
    assert not removed[:, :, 1:, 0].all() and not torch.equal(removed, by_key)
    # the order is the tie-break's: the k highest tie-break draws of each row
    k = torch.floor(0.5 * elig.sum(-1) + 0.5)
    top = ties.masked_fill(~elig, -1).argsort(-1, descending=True).argsort(-1) < k[..., None]
    assert torch.equal(removed, top & elig)
    # scores still come first: a strictly better entry is never displaced by the draw
    scores = _tied_scores(1)
    ranking = rank_entries(scores, elig, "row", ties)
    better = scores[..., :, None] > scores[..., None, :]
    assert (ranking.rank[..., :, None] < ranking.rank[..., None, :])[better & elig[..., None] & elig[..., None, :]].all()


def test_tiebreak_does_not_depend_on_the_batch():
    mask = torch.ones(3, 6, dtype=torch.bool)
    both = tiebreak_scores((3, 2, 6, 6), mask, ["x", "y", "z"], seed=4, layer=2)
    alone = tiebreak_scores((1, 2, 6, 6), mask[:1], ["y"], seed=4, layer=2)
    assert torch.equal(both[1:2], alone)
    assert not torch.equal(tiebreak_scores((1, 2, 6, 6), mask[:1], ["y"], seed=5, layer=2), alone)


def _brute_counts(scores, elig, removed, first):
    """Per sample: removed entries, those with an equal-scored kept eligible entry in
    the same row, and those on the first token."""
    b, h, q, k = scores.shape
    out = torch.zeros(b, 3, dtype=torch.int64)
    for bi, hi, qi in itertools.product(range(b), range(h), range(q)):
        for j in range(k):
            if not removed[bi, hi, qi, j]:
                continue
            out[bi, 0] += 1
            out[bi, 2] += int(first[bi, 0, 0, j])
            kept = [jj for jj in range(k) if elig[bi, 0, qi, jj] and not removed[bi, hi, qi, jj]]
            out[bi, 1] += int(any(scores[bi, hi, qi, jj] == scores[bi, hi, qi, j] for jj in kept))
    return out


@pytest.mark.parametrize("mode", ["comprehensiveness", "sufficiency"])
@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_mask_counts_equal_brute_force(mode, rate):
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[1, :3] = False  # left padding: the first real token is 3
    elig = eligible_entries(mask)
    scores = _tied_scores(2)
    ties = tiebreak_scores(scores.shape, mask, ["a", "b"], seed=0, layer=0)
    removed = rank_entries(scores, elig, "row", ties).mask(rate, mode)
    first = first_token(mask)
    got = mask_counts(scores, elig, removed, "row", first)
    assert torch.equal(got, _brute_counts(scores, elig, removed, first))
    assert got[:, 1].sum() > 0  # this case has ties across the cut
    shares = mask_shares(got[0])
    assert shares["tied_share"] == got[0, 1].item() / got[0, 0].item()
    # continuous scores: nothing tied; every eligible entry removed: no cut, no tie
    assert mask_counts(torch.rand(scores.shape), elig, removed, "row", first)[:, 1].sum() == 0
    assert mask_counts(None, elig, elig.expand(scores.shape), "row", first)[:, 1].sum() == 0


def test_sweep_reports_tied_and_first_token_shares():
    from cwlens.datasets import TextSample
    from cwlens.faithfulness.sweep import FaithfulnessConfig, run_faithfulness
    from cwlens.testing import tiny_model

    model = tiny_model("llama")
    samples = [TextSample(id=f"s{i}", text="the cat sat on the mat and the dog ran fast", dataset="t")
               for i in range(2)]
    shares = {}
    for first in (True, False):
        cfg = FaithfulnessConfig(metrics=("attention", "alti"), rates=(0.5,), mask_first_token=first)
        table = run_faithfulness(model, samples, cfg, progress=False).to_dataframe()
        for measure in ("tied_share", "first_token_share"):
            values = table[(table.measure == measure) & (table["mode"] != "clean")]["value"]
            assert len(values) == 2 * 2 * 2 and values.between(0, 1).all()
            shares[first, measure] = values.mean()
    assert shares[True, "first_token_share"] > 0 and shares[False, "first_token_share"] == 0


def test_seeded_draws_of_a_prefix_are_the_prefix_of_the_draws():
    """Row i's random order depends on (seed, sample, layer, head, i, j) only, never on how
    many tokens follow: the causal head/layer masks and token-by-token scoring rely on it."""
    from cwlens.faithfulness.ranking import random_scores
    long_mask, short_mask = torch.ones(1, 9, dtype=torch.bool), torch.ones(1, 5, dtype=torch.bool)
    for draw in (tiebreak_scores, random_scores):
        full = draw((1, 2, 9, 9), long_mask, ["s"], seed=3, layer=1)
        prefix = draw((1, 2, 5, 5), short_mask, ["s"], seed=3, layer=1)
        torch.testing.assert_close(full[:, :, :5, :5], prefix, rtol=0, atol=0)
        assert full.unique().numel() == full.numel()  # no ties among the draws
        assert 0.0 <= float(full.min()) and float(full.max()) < 1.0


@pytest.mark.parametrize("scope", ["row", "head", "layer"])
def test_one_sort_ranking_equals_the_two_sort_definition(scope):
    """rank_entries sorts once on (score, tie-break) keys: the order is the definition's
    (a stable sort by the tie-break, then a stable sort by score), with many ties, -0.0
    and 0.0, negative and ineligible entries, and tie-break values that collide."""
    from cwlens.faithfulness.ranking import _units, rank_entries

    g = torch.Generator().manual_seed(3)
    b, h, q, k = 2, 3, 7, 7
    scores = torch.randint(-3, 4, (b, h, q, k), generator=g).float() / 2
    scores[scores == 0] = torch.where(torch.rand(int((scores == 0).sum()), generator=g) < 0.5, -0.0, 0.0)
    tiebreak = torch.randint(0, 5, (b, h, q, k), generator=g).float() / 5  # collisions
    eligible = torch.rand(b, 1, q, k, generator=g) < 0.8
    got = rank_entries(scores, eligible, scope, tiebreak)
    s = _units(scores.masked_fill(~eligible.expand(b, h, q, k), float("-inf")), scope)
    pre = torch.sort(_units(tiebreak, scope), dim=-1, descending=True, stable=True).indices
    order = pre.gather(-1, torch.sort(s.gather(-1, pre), dim=-1, descending=True, stable=True).indices)
    want = torch.empty_like(order)
    want.scatter_(-1, order, torch.arange(order.shape[-1]).expand(order.shape))
    assert torch.equal(got.rank.long(), want.reshape(b, h, q, k))
