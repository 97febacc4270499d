"""Acceptance tier: the real offline model (SmolLM2-135M-Instruct, Q4_1 GGUF -> float32)."""

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.datasets import load_dataset
from cwlens.engine import adapter
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.testing import naive_measures

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gsm8k_run(smollm2):
    texts = [s.text for s in load_dataset("gsm8k", n=2)]
    tokens, mask = pad_batch(smollm2, texts, max_tokens=48)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(smollm2, tokens, attention_mask=mask, closure=True)
    return tokens, mask, cache


def test_real_model_shape_and_sums(smollm2, gsm8k_run):
    _, mask, cache = gsm8k_run
    c = cwlens.contribution_weights(cache, smollm2, attention_mask=mask)
    assert c.shape == (30, 2, 9, 48, 48) and c.dtype == torch.float32
    real = mask.bool()
    sums = c.sum((2, 4))[:, real]
    assert_close(sums, torch.ones_like(sums), rtol=0, atol=2e-5)
    intra = cwlens.contribution_weights(cache, smollm2, kind="intra", attention_mask=mask)
    rows = intra.sum(-1).permute(0, 1, 3, 2)[:, real]
    assert_close(rows, torch.ones_like(rows), rtol=0, atol=2e-5)


def test_real_model_closure_and_factors(smollm2, gsm8k_run):
    _, mask, cache = gsm8k_run
    report = cwlens.closure(cache, smollm2, attention_mask=mask)
    assert report.worst_relative_error < 1e-5, report
    for kind in ("intra", "inter"):
        assert cwlens.decompose(cache, smollm2, [0, 15, 29], kind, mask).max_product_error < 1e-4


def test_real_model_equals_float64_naive(smollm2, gsm8k_run):
    _, mask, cache = gsm8k_run
    for layer in (0, 14, 29):
        geo = adapter.geometry(cache, wrap(smollm2), layer, mask)
        ref = naive_measures(geo.pattern[:, :, :24, :24], geo.v[:, :24], geo.W_O, mask[:, :24].bool())
        small = {k: v[:, :24] for k, v in cache.items()}  # keys 0..23 of the padded batch
        small = {k: (v[:, :, :24, :24] if v.ndim == 4 and "pattern" in k else v) for k, v in small.items()}
        for kind in ("intra", "inter"):
            got = cwlens.contribution_weights(small, smollm2, layer, kind, mask[:, :24])
            assert_close(got.double(), ref[f"contribution_{kind}"], rtol=1e-3, atol=1e-5)


def test_real_model_padded_batch_equals_single_runs(smollm2, gsm8k_run):
    tokens, mask, cache = gsm8k_run
    batch = cwlens.contribution_weights(cache, smollm2, [0, 29], attention_mask=mask)
    for i in range(tokens.shape[0]):
        keep = mask[i].bool()
        with torch.no_grad():
            _, one = cwlens.run_with_cache(smollm2, tokens[i, keep][None], layers=[0, 29])
        alone = cwlens.contribution_weights(one, smollm2, [0, 29])[:, 0]
        assert_close(batch[:, i][:, :, keep][:, :, :, keep], alone, rtol=1e-3, atol=1e-4)


def test_compatibility_mode_keeps_the_identities():
    model = cwlens.load_model("smollm2-135m", device="cpu", compatibility_mode=True)
    tokens = model.to_tokens("The capital of France is Paris, and the capital of Italy is")
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, closure=True)
    c = cwlens.contribution_weights(cache, model)
    assert_close(c.sum((2, 4)), torch.ones_like(c.sum((2, 4))), rtol=0, atol=2e-5)
    assert cwlens.closure(cache, model).worst_relative_error < 1e-5


def test_real_model_long_sequence_identities(smollm2):
    """n = 640 > d_model = 576: the inter projection takes the Gram-matrix path."""
    tokens = torch.randint(100, 40000, (1, 640), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(smollm2, tokens, layers=[0, 29], closure=True)
    c = cwlens.contribution_weights(cache, smollm2, [0, 29])
    assert_close(c.sum((2, 4)), torch.ones_like(c.sum((2, 4))), rtol=0, atol=5e-5)
    assert cwlens.closure(cache, smollm2, [0, 29]).worst_relative_error < 1e-5
