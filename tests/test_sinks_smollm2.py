"""Acceptance tier for the sink hooks on the real offline model (SmolLM2-135M, Q4_1 GGUF)."""

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.core.sinks import SinkGeometry, first_real_index
from cwlens.datasets import load_dataset
from cwlens.engine import adapter, hook_names
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.engine.interventions import sinks as hooks

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sink_run(smollm2):
    texts = [s.text for s in load_dataset("gsm8k", n=2)]
    tokens, mask = pad_batch(smollm2, texts, max_tokens=24)
    tokens, mask = tokens[:, -20:], mask[:, -20:]  # left padding: keep the sinks
    with torch.no_grad():
        logits, cache = cwlens.run_with_cache(smollm2, tokens, attention_mask=mask)
    return tokens, mask, logits, cache, first_real_index(mask.bool())


def test_real_model_hooks_are_identities_at_own_rate_and_scale_one(smollm2, sink_run):
    tokens, mask, logits, cache, sink = sink_run
    own = {ly: SinkGeometry(adapter.geometry(cache, wrap(smollm2), ly, mask), sink).alpha0
           for ly in range(smollm2.cfg.n_layers)}
    real = mask.bool()
    with torch.no_grad(), hooks.applied(smollm2, hooks.sink_rate_hooks(smollm2, own, sink)):
        out = smollm2(tokens, attention_mask=mask)
    assert_close(out[real], logits[real], rtol=1e-4, atol=1e-4)
    with torch.no_grad(), hooks.applied(smollm2, hooks.sink_value_hooks(smollm2, 1.0, sink)):
        out = smollm2(tokens, attention_mask=mask)
    assert_close(out, logits, rtol=0, atol=0)
    assert hooks.n_hooks(wrap(smollm2)) == 0


def test_real_model_hooked_sweep_follows_closed_form(smollm2, sink_run):
    tokens, mask, _, cache, sink = sink_run
    layer = smollm2.cfg.n_layers - 1
    sg = SinkGeometry(adapter.geometry(cache, wrap(smollm2), layer, mask), sink)
    name = hook_names.z(layer)
    for s in (0.5,):
        with torch.no_grad(), hooks.applied(smollm2, hooks.sink_rate_hooks(smollm2, s, sink, layer)):
            _, c = smollm2.run_with_cache(tokens, attention_mask=mask, names_filter=lambda n: n == name)
        o = torch.einsum("bqhd,hdm->bhqm", c[name].float(), sg.geo.W_O)
        closed = sg.curve([s])[0]
        assert_close(o.norm(dim=-1)[sg.valid], closed[sg.valid], rtol=1e-3, atol=1e-4)
