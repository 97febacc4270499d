"""Integration tier: every identity on tiny seeded models of every supported architecture.

Runs under whichever TransformerLens is installed: TransformerBridge (4.x) in .venv,
HookedTransformer/HookedEncoder (3.x) in .venv-tl3 (see scripts/test.sh).
"""

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.engine import adapter
from cwlens.engine.batching import is_encoder, pad_batch
from cwlens.testing import ARCHITECTURES, naive_measures, tiny_model

TEXTS = [
    "the cat sat on the mat",
    "mary gave john a bottle of milk when they went to the store .",
    "paris is the capital of france",
]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def run(request):
    model = tiny_model(request.param)
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask, closure=True)
    return model, tokens, mask, cache


def real(mask):
    return mask.bool()


def test_inter_sums_to_one_over_heads_and_keys(run):
    model, _, mask, cache = run
    c = cwlens.contribution_weights(cache, model, attention_mask=mask)  # [L, b, h, q, k]
    sums = c.sum((2, 4))  # [L, b, q]
    assert_close(sums[:, real(mask)], torch.ones_like(sums[:, real(mask)]), rtol=0, atol=1e-5)
    token = cwlens.token_contributions(cache, model, attention_mask=mask)
    assert_close(token.sum(-1), sums)


def test_intra_rows_sum_to_one(run):
    model, _, mask, cache = run
    c = cwlens.contribution_weights(cache, model, kind="intra", attention_mask=mask)
    sums = c.sum(-1).permute(0, 1, 3, 2)  # [L, b, q, h]
    assert_close(sums[:, real(mask)], torch.ones_like(sums[:, real(mask)]), rtol=0, atol=1e-5)


def test_heads_and_keys_rebuild_attention_output(run):
    model, _, mask, cache = run
    report = cwlens.closure(cache, model, attention_mask=mask)
    assert report.worst_relative_error < 1e-5, report


@pytest.mark.parametrize("kind", ["intra", "inter"])
def test_factors_multiply_to_weight(run, kind):
    model, _, mask, cache = run
    parts = cwlens.decompose(cache, model, kind=kind, attention_mask=mask)
    assert parts.max_product_error < 1e-5
    assert_close(parts.contribution, cwlens.contribution_weights(cache, model, kind=kind, attention_mask=mask))


def test_fast_path_equals_float64_naive(run):
    model, _, mask, cache = run
    for layer in range(model.cfg.n_layers):
        geo = adapter.geometry(cache, model, layer, mask)
        ref = naive_measures(geo.pattern, geo.v, geo.W_O, mask.bool())
        for kind in ("intra", "inter"):
            got = cwlens.importance(cache, model, layer, "contribution", kind, attention_mask=mask)
            assert_close(got.double(), ref[f"contribution_{kind}"], rtol=1e-4, atol=1e-5)
            got = cwlens.importance(
                cache, model, layer, "value_weighted_output_normalized", kind, attention_mask=mask
            )
            assert_close(got.double(), ref[f"value_weighted_output_normalized_{kind}"], rtol=1e-4, atol=1e-5)
        got = cwlens.importance(cache, model, layer, "value_weighted", attention_mask=mask)
        assert_close(got.double(), ref["value_weighted"], rtol=1e-4, atol=1e-5)


def test_padded_batch_equals_single_runs(run):
    model, tokens, mask, cache = run
    batch = cwlens.contribution_weights(cache, model, attention_mask=mask)
    for i in range(len(TEXTS)):
        keep = mask[i].bool()
        single = tokens[i, keep][None]
        with torch.no_grad():
            _, one = cwlens.run_with_cache(model, single)
        alone = cwlens.contribution_weights(one, model)[:, 0]  # [L, h, n, n]
        padded = batch[:, i][:, :, keep][:, :, :, keep]
        assert_close(padded, alone, rtol=1e-4, atol=2e-5)


def test_pad_positions_are_zero_not_nan(run):
    model, _, mask, cache = run
    for kind in ("intra", "inter"):
        parts = cwlens.decompose(cache, model, kind=kind, attention_mask=mask)
        for name in ("contribution", "cosine", "relative_norm"):
            t = getattr(parts, name)
            assert torch.isfinite(t).all()
            pad = ~mask.bool()
            assert (t.permute(1, 3, 0, 2, 4)[pad] == 0).all()  # pad queries
            assert (t.permute(1, 4, 0, 2, 3)[pad] == 0).all()  # pad keys


def test_causal_models_give_zero_weight_to_future_keys(run):
    model, _, mask, cache = run
    c = cwlens.contribution_weights(cache, model, attention_mask=mask)
    if is_encoder(model):
        assert (c.triu(1) != 0).any()  # bidirectional: future keys do contribute
    else:
        assert (c.triu(1) == 0).all()
