"""Causal head/layer scopes: the mask for query i is decided from rows <= i only, so a
continuation scored whole gets the log-likelihood it gets token by token."""

import math

import pytest
import torch

from cwlens.core.prefix_rank import prefix_ranks
from cwlens.engine.handle import wrap
from cwlens.faithfulness.causal_scope import LeakingScopeError, causal_ranking
from cwlens.faithfulness.ranking import eligible_entries, rank_entries
from cwlens.testing import random_layer


def test_prefix_ranks_equal_brute_force():
    g = torch.Generator().manual_seed(0)
    for u, q, m in ((3, 7, 5), (2, 8, 1), (1, 1, 4), (2, 13, 3)):
        keys = torch.stack([torch.randperm(q * m, generator=g) for _ in range(u)]).view(u, q, m)
        got = prefix_ranks(keys)
        for a in range(u):
            for i in range(q):
                prefix = keys[a, : i + 1].flatten()
                want = (prefix[None, :] < keys[a, i][:, None]).sum(-1)
                assert torch.equal(got[a, i], want), (u, q, m, a, i)


def _batch(seed=0, pos=9):
    pattern, _, _ = random_layer(batch=3, n_heads=4, n_kv=2, pos=pos, seed=seed)
    mask = torch.ones(3, pos, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    mask[2, :5] = 0
    return torch.randn(pattern.shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64), mask


def _reference(scores, elig, scope, rate, mode):
    """The definition, from the float64 scores: row i of unit u masks its entries among
    the k_i = round_half_up(rate * n_i) top (or bottom) eligible entries of rows <= i."""
    b, h, q, k = scores.shape
    e = elig.expand(b, h, q, k)
    out = torch.zeros(b, h, q, k, dtype=torch.bool)
    heads = [[x] for x in range(h)] if scope == "head" else [list(range(h))]
    for s in range(b):
        for hs in heads:
            for i in range(q):
                cand = [(float(scores[s, x, i2, j]), x, i2, j) for x in hs for i2 in range(i + 1)
                        for j in range(k) if e[s, x, i2, j]]
                n_i = len(cand)
                k_i = math.floor(rate * n_i + 0.5)
                cand.sort(key=lambda c: -c[0])  # no ties among normal draws
                chosen = cand[:k_i] if mode == "comprehensiveness" else cand[n_i - k_i:]
                for _, x, i2, j in chosen:
                    if i2 == i:
                        out[s, x, i, j] = True
    return out


@pytest.mark.parametrize("scope", ["head", "layer"])
@pytest.mark.parametrize("first", [True, False])
def test_causal_masks_follow_the_definition(scope, first):
    scores, mask = _batch()
    elig = eligible_entries(mask, mask_first_token=first)
    ranking = causal_ranking(rank_entries(scores, elig, scope))
    for rate in (0.1, 0.3, 0.5, 1.0):
        for mode in ("comprehensiveness", "sufficiency"):
            assert torch.equal(ranking.mask(rate, mode), _reference(scores, elig, scope, rate, mode))


@pytest.mark.parametrize("scope", ["row", "head", "layer"])
def test_causal_mask_of_a_prefix_is_the_prefix_of_the_mask(scope):
    scores, mask = _batch(1)
    elig = eligible_entries(mask)
    full = causal_ranking(rank_entries(scores, elig, scope))
    for i in (5, 6, 8):
        part = causal_ranking(rank_entries(scores[..., : i + 1, : i + 1],
                                           eligible_entries(mask[:, : i + 1]), scope))
        for mode in ("comprehensiveness", "sufficiency"):
            want = full.mask(0.3, mode)[..., : i + 1, : i + 1]
            assert torch.equal(part.mask(0.3, mode), want), (scope, i, mode)


def test_non_causal_head_scope_sees_the_future():
    """Why: the old head-scope mask of the first rows changes with the later rows."""
    scores, mask = _batch(1)
    elig = eligible_entries(mask)
    full = rank_entries(scores, elig, "head").mask(0.3, "comprehensiveness")[..., :6, :6]
    part = rank_entries(scores[..., :6, :6], eligible_entries(mask[:, :6]), "head")
    assert not torch.equal(part.mask(0.3, "comprehensiveness"), full)


# --- a model: whole continuation = token by token -----------------------------------------

@pytest.fixture(scope="module")
def tiny():
    from cwlens.testing import tiny_model

    return tiny_model("llama")


def _whole_and_stepwise(model, cfg):
    from cwlens.engine.batching import token_ids
    from cwlens.lmeval.requests import token_request
    from cwlens.lmeval.scoring import score_requests

    ids = token_ids(model, "mary gave john a bottle of milk when they went to the store .").tolist()
    ctx, cont = ids[:4], ids[4:]
    whole = score_requests(wrap(model), [token_request(ctx, cont, 64)], [("whole",)], cfg)[0][0]
    steps = [token_request(ctx + cont[:t], cont[t:t + 1], 64, item=t) for t in range(len(cont))]
    lls = score_requests(wrap(model), steps, [("step", t) for t in range(len(cont))], cfg)
    return whole, sum(ll for ll, _ in lls)


@pytest.mark.parametrize("scope", ["row", "head", "layer"])
@pytest.mark.parametrize("metric,mode", [("contribution", "comprehensiveness"),
                                         ("attention", "sufficiency"),
                                         ("value_weighted_output_normalized", "comprehensiveness")])
def test_whole_continuation_equals_sum_of_token_by_token(tiny, scope, metric, mode):
    from cwlens.lmeval.settings import masking_config

    cfg = masking_config(metric, mode, 0.3, scope=scope)
    whole, stepwise = _whole_and_stepwise(tiny, cfg)
    clean, _ = _whole_and_stepwise(tiny, masking_config(None))
    assert abs(whole - clean) > 1e-2  # the mask acts
    assert whole == pytest.approx(stepwise, abs=1e-4)


def test_non_causal_head_scope_is_refused_where_it_would_leak(tiny):
    from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
    from cwlens.lmeval.requests import token_request
    from cwlens.lmeval.scoring import score_requests

    cfg = FaithfulnessConfig(metrics=("attention",), rates=(0.3,), scope="head", causal_only=False)
    with pytest.raises(LeakingScopeError, match=r"causal_only=True.*scope='row'"):
        run_faithfulness(tiny, "gsm8k", cfg, n=1, progress=False)
    with pytest.raises(LeakingScopeError, match="lm-eval"):
        score_requests(wrap(tiny), [token_request([1, 2], [3], 64)], [0], cfg)
    row = FaithfulnessConfig(metrics=("attention",), rates=(0.3,), modes=("sufficiency",),
                             causal_only=False)
    assert score_requests(wrap(tiny), [token_request([1, 2], [3], 64)], [0], row)[0][0] < 0
