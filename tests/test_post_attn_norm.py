"""A norm after attention (Gemma-2/3's ``post_attention_layernorm``) is seen on either
TransformerLens generation (issue 17): TransformerLens 4.x names it ``ln1_post`` and
leaves ``cfg.use_normalization_before_and_after`` False, so the bridge was treated as a
plain pre-norm decoder and full ALTI was computed as if the heads' output reached the
residual stream unnormalised. Every consumer first refused it; full ALTI now goes
through the norm (:class:`cwlens.core.alti.AttentionOutputNorm`, its RMS held at the
attention output's), checked here against the float64 definition.
"""

import importlib.util

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.datasets import TextSample
from cwlens.engine import adapter, hook_names
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.errors import UnsupportedModelError
from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
from cwlens.replication import plan, stages
from cwlens.testing import naive_alti, tiny_model

TEXTS = ["the cat sat on the mat and the dog ran fast", "paris is the capital of france"]


@pytest.fixture(scope="module")
def gemma():
    model = tiny_model("gemma3")  # a bridge here (TransformerLens 4.x)
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask, closure=True)
    return model, tokens, mask, cache


def test_the_norm_is_there_and_the_handle_sees_it(gemma):
    model, tokens, _, _ = gemma
    assert cwlens.wrap(model).generation == "bridge"
    # the premise: what the heads wrote (o_proj) is normalised before the residual sum
    names = {hook_names.o_proj_out(0), hook_names.resid_pre(0), hook_names.resid_mid(0)}
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    added = cache[hook_names.resid_mid(0)] - cache[hook_names.resid_pre(0)]
    assert (added - cache[hook_names.o_proj_out(0)]).abs().max() > 0.1
    info = adapter.ModelInfo.of(model)
    assert info.post_attn_norm is True
    assert any("a norm after attention" in p for p in cwlens.wrap(model).residual_problems())
    # the closure target stays the projection's own output, before the norm
    assert adapter.closure_hook(wrap(model), 0) == hook_names.o_proj_out(0)
    with pytest.raises(UnsupportedModelError, match="a norm after attention"):
        adapter.check_residual_model(wrap(model), "The token flow")
    llama = tiny_model("llama")
    assert adapter.ModelInfo.of(llama).post_attn_norm is False
    assert cwlens.wrap(llama).residual_problems() == []


def test_an_encoder_bridge_is_a_residual_problem_too():
    """BERT on the bridge: post-norm blocks, named up front as for HookedEncoder."""
    problems = cwlens.wrap(tiny_model("bert")).residual_problems()
    assert problems == ["it is an encoder with post-norm residual blocks"]


def test_full_alti_goes_through_the_norm_and_alti_attention_is_exact(gemma):
    from cwlens.core.alti import AttentionOutputNorm
    from cwlens.testing import naive_alti_full

    model, _, mask, cache = gemma
    for layer in (0, 1):
        norm = adapter.post_attention_layernorm(wrap(model), layer)
        hf = model.blocks[layer].ln1_post._original_component  # Gemma scales by 1 + weight
        assert isinstance(norm, AttentionOutputNorm) and norm.eps == hf.eps
        assert_close(norm.weight, 1 + hf.weight.detach(), rtol=0, atol=1e-6)
        geo = adapter.geometry(cache, wrap(model), layer, mask)
        ref, _ = naive_alti_full(geo.pattern, geo.v, geo.W_O, geo.require_residual("t")[0],
                                 wrap(model).b_O(layer), mask.bool(), attn_norm=(norm.weight, norm.eps))
        assert_close(geo.alti().double(), ref, rtol=1e-4, atol=1e-5)
        ref = naive_alti(geo.pattern, geo.v, geo.W_O, mask.bool())
        for kind in ("inter", "intra"):
            assert_close(geo.alti_attention(kind).double(), ref[f"alti_{kind}"], rtol=1e-4, atol=1e-6)
    assert_close(cwlens.importance(cache, model, 1, "alti", "inter", mask), adapter.geometry(cache, wrap(model), 1, mask).alti())


def test_a_norm_of_another_form_is_refused_naming_it(gemma):
    model = tiny_model("gemma3")
    module = model.blocks[0].ln1_post._original_component
    plain = module.forward
    module.forward = lambda x: plain(x) + 0.5  # not gamma * u / rms(u)
    with pytest.raises(UnsupportedModelError, match="not an RMSNorm.*alti_attention"):
        adapter.post_attention_layernorm(wrap(model), 0)
    samples = [TextSample(id="s0", text=TEXTS[0], dataset="t")]
    with pytest.raises(UnsupportedModelError, match="not an RMSNorm"):
        run_faithfulness(model, samples, FaithfulnessConfig(metrics=("alti",), rates=(0.5,)), progress=False)


def test_runs_compute_full_alti_through_the_norm(gemma):
    model = gemma[0]
    samples = [TextSample(id=f"s{i}", text=t, dataset="t") for i, t in enumerate(TEXTS)]
    cfg = FaithfulnessConfig(metrics=("attention", "alti"), rates=(0.5,))
    table = run_faithfulness(model, samples, cfg, progress=False).table
    assert "alti" in set(table.metric) and table.value.notna().all()
    from cwlens.faithfulness.accuracy import run_accuracy_test

    acc = run_accuracy_test(model, "capitals", cfg, n=4, allow_chance=True, progress=False)
    assert "alti" in set(acc.result.table.metric)


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed")
def test_lmeval_accepts_full_alti(gemma):
    from cwlens.lmeval.model import CwlensMaskedLM

    CwlensMaskedLM(model=gemma[0], metric="alti", mode="comprehensiveness", rate=0.3)


def test_replication_keeps_full_alti_in_every_stage(gemma):
    model = gemma[0]
    cfg = plan.ReplicationConfig()
    assert "alti" in cfg.decoder_metrics and "alti" in plan.PER_LAYER_METRICS
    assert stages.faithfulness_config(cfg, wrap(model)).metrics == cfg.decoder_metrics
    per_layer = stages.faithfulness_config(cfg, wrap(model), metrics=plan.PER_LAYER_METRICS, per_layer=True)
    assert per_layer.metrics == plan.PER_LAYER_METRICS
