"""Acceptance tier, opt-in: the real Gemma-3-270M (Q4_K_M GGUF -> float32), the same
identities as SmolLM2 on a second decoder with sliding-window and global layers, GQA
(4 query heads, 1 kv head), QK-norm and post-attention norms. Skipped with the reason
when the weights are not installed (``scripts/setup.sh --gemma``)."""

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.datasets import load_dataset
from cwlens.engine import adapter
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.testing import naive_alti, naive_measures

pytestmark = pytest.mark.slow
SLIDING, GLOBAL = 0, 5  # layer 5 is the first global (full-attention) layer


@pytest.fixture(scope="module")
def gsm8k_run(gemma3):
    texts = [s.text for s in load_dataset("gsm8k", n=2)]
    tokens, mask = pad_batch(gemma3, texts, max_tokens=40)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(gemma3, tokens, attention_mask=mask, closure=True)
    return tokens, mask, cache


def test_layer_types_and_shapes(gemma3, gsm8k_run):
    windows = [wrap(gemma3).attention_window(ly) for ly in range(gemma3.cfg.n_layers)]
    assert windows == [None if ly % 6 == 5 else 512 for ly in range(18)]
    _, mask, cache = gsm8k_run
    c = cwlens.contribution_weights(cache, gemma3, attention_mask=mask)
    assert c.shape == (18, 2, 4, 40, 40) and c.dtype == torch.float32


def test_sums_to_one_and_closure(gemma3, gsm8k_run):
    _, mask, cache = gsm8k_run
    real = mask.bool()
    c = cwlens.contribution_weights(cache, gemma3, attention_mask=mask)
    sums = c.sum((2, 4))[:, real]
    assert_close(sums, torch.ones_like(sums), rtol=0, atol=5e-5)
    intra = cwlens.contribution_weights(cache, gemma3, kind="intra", attention_mask=mask)
    rows = intra.sum(-1).permute(0, 1, 3, 2)[:, real]
    assert_close(rows, torch.ones_like(rows), rtol=0, atol=5e-5)
    report = cwlens.closure(cache, gemma3, attention_mask=mask)
    assert report.worst_relative_error < 1e-5, report


def test_equals_float64_naive(gemma3, gsm8k_run):
    _, mask, cache = gsm8k_run
    for layer in (SLIDING, GLOBAL, 17):
        geo = adapter.geometry(cache, wrap(gemma3), layer, mask)
        args = (geo.pattern, geo.v, geo.W_O, mask.bool())
        ref, ref_alti = naive_measures(*args), naive_alti(*args)
        for kind in ("intra", "inter"):
            got = cwlens.contribution_weights(cache, gemma3, layer, kind, mask)
            assert_close(got.double(), ref[f"contribution_{kind}"], rtol=1e-3, atol=1e-5)
            assert_close(geo.alti_attention(kind).double(), ref_alti[f"alti_{kind}"], rtol=1e-3, atol=1e-5)


def test_padded_batch_equals_single_runs(gemma3, gsm8k_run):
    tokens, mask, cache = gsm8k_run
    batch = cwlens.contribution_weights(cache, gemma3, [SLIDING, GLOBAL], attention_mask=mask)
    for i in range(tokens.shape[0]):
        keep = mask[i].bool()
        with torch.no_grad():
            _, one = cwlens.run_with_cache(gemma3, tokens[i, keep][None], layers=[SLIDING, GLOBAL])
        alone = cwlens.contribution_weights(one, gemma3, [SLIDING, GLOBAL])[:, 0]
        assert_close(batch[:, i][:, :, keep][:, :, :, keep], alone, rtol=1e-3, atol=1e-4)


def test_sliding_window_beyond_512_tokens(gemma3):
    """n = 600 > window 512: a sliding layer gives exactly 0 outside its window (and still
    sums to 1), a global layer does not; closure holds on both."""
    tokens = torch.randint(1000, 50000, (1, 600), generator=torch.Generator().manual_seed(0))
    tokens[0, 0] = gemma3.tokenizer.bos_token_id
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(gemma3, tokens, layers=[SLIDING, GLOBAL], closure=True)
    c = cwlens.contribution_weights(cache, gemma3, [SLIDING, GLOBAL])
    outside = torch.ones(600, 600).tril(-512).bool()
    assert (c[0][..., outside] == 0).all()
    assert (c[1][..., outside] != 0).any()
    assert_close(c.sum((2, 4)), torch.ones_like(c.sum((2, 4))), rtol=0, atol=1e-4)
    assert cwlens.closure(cache, gemma3, [SLIDING, GLOBAL]).worst_relative_error < 1e-5


def test_full_alti_through_the_post_attention_norm_equals_its_definition(gemma3, gsm8k_run):
    """Issue 17: full ALTI goes through Gemma-3's post_attention_layernorm (an RMSNorm, its
    scale held at the attention output's): its whole ``x + N(attn)`` is the model's
    resid_mid, and the shares equal the float64 definition on the real weights."""
    from cwlens.core.alti import AttentionOutputNorm, alti_parts
    from cwlens.engine import hook_names
    from cwlens.replication import plan, stages
    from cwlens.testing import naive_alti_full

    tokens, mask, _ = gsm8k_run
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(gemma3, tokens, attention_mask=mask, layers=[SLIDING, GLOBAL],
                                         residual=True)
    real = mask.bool()
    for layer in (SLIDING, GLOBAL):
        norm = adapter.post_attention_layernorm(wrap(gemma3), layer)
        assert isinstance(norm, AttentionOutputNorm)
        geo = adapter.geometry(cache, wrap(gemma3), layer, mask)
        x = cache[hook_names.resid_pre(layer)]
        attn = geo.layer_output + wrap(gemma3).b_O(layer)
        mid = x + norm.weight * attn / (attn.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
        want = cache[hook_names.resid_mid(layer)]
        assert ((mid - want)[real].abs().max() / want[real].abs().max()) < 1e-5
        ref, ref_resid = naive_alti_full(geo.pattern, geo.v, geo.W_O, x, wrap(gemma3).b_O(layer),
                                         real, attn_norm=(norm.weight, norm.eps))
        entries, resid = alti_parts(geo)
        assert_close(entries.double(), ref, rtol=1e-3, atol=1e-5)
        assert_close(resid.double(), ref_resid, rtol=1e-3, atol=1e-5)
    fc = stages.faithfulness_config(plan.ReplicationConfig(), wrap(gemma3), metrics=plan.PER_LAYER_METRICS)
    assert "alti" in fc.metrics
