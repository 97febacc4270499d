"""Integration tier: every identity on tiny seeded models of every supported architecture.

Runs under whichever TransformerLens is installed: TransformerBridge (4.x) in .venv,
HookedTransformer/HookedEncoder (3.x) in .venv-tl3 (see scripts/test.sh).
"""

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.engine import adapter
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
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
        geo = adapter.geometry(cache, wrap(model), layer, mask)
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
    if wrap(model).is_encoder:
        assert (c.triu(1) != 0).any()  # bidirectional: future keys do contribute
    else:
        assert (c.triu(1) == 0).all()


def test_full_alti_whole_is_the_models_residual_after_attention(run):
    """Full ALTI on every architecture and generation: the float64 definition on the
    cached hooks, and (decoders) its whole is the model's resid_mid: ``x + attn`` for
    pre-LN models, ``x + N(attn)`` with Gemma-3's RMSNorm read from the model."""
    from cwlens.core.alti import AttentionOutputNorm, alti_parts
    from cwlens.engine import hook_names
    from cwlens.testing import naive_alti_full

    model, tokens, mask, _ = run
    layer = 1
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask, layers=[layer],
                                         residual=True)
    geo = adapter.geometry(cache, wrap(model), layer, attention_mask=mask)
    norm = adapter.post_attention_layernorm(wrap(model), layer)
    assert isinstance(norm, AttentionOutputNorm) == adapter.ModelInfo.of(model).post_attn_norm
    b_O = wrap(model).b_O(layer)
    if not wrap(model).is_encoder:
        attn = geo.layer_output + b_O
        if isinstance(norm, AttentionOutputNorm):
            attn = norm.weight * attn / (attn.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
        real_q = real(mask)
        assert_close((cache[hook_names.resid_pre(layer)] + attn)[real_q],
                     cache[hook_names.resid_mid(layer)][real_q], rtol=1e-4, atol=1e-4)
    extra = {}
    if isinstance(norm, AttentionOutputNorm):
        extra["attn_norm"] = (norm.weight, norm.eps)
    elif norm is not None:
        extra["norm"] = (norm.weight, norm.bias, norm.eps)
    ref, ref_resid = naive_alti_full(cache[hook_names.pattern(layer)], cache[hook_names.values(layer)],
                                     wrap(model).W_O(layer), cache[hook_names.resid_pre(layer)],
                                     b_O, real(mask), **extra)
    entries, resid = alti_parts(geo)
    assert_close(entries.double(), ref, rtol=1e-4, atol=1e-5)
    assert_close(resid.double(), ref_resid, rtol=1e-4, atol=1e-5)
