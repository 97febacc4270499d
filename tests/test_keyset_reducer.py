"""``reducers.KeySetWeight`` (what a key set -- the first token, StreamingLLM's first four --
receives per query) equals the same reduction of the full tensors of a cached run,
recomputed in float64 from the definitions (:func:`cwlens.testing.naive_measures`): every
tiny architecture, a left/right-padded batch, blocks of 1-3 queries and whole layers,
both kinds. Runs under both TransformerLens generations (see scripts/test.sh)."""


import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.engine import adapter, hook_names, reducers
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.errors import CwlensError
from cwlens.testing import ARCHITECTURES, naive_measures, tiny_model

TEXTS = ["the cat", "mary gave john a bottle of milk when they went to the store .",
         "paris is the capital of france"]
TOL = dict(rtol=1e-5, atol=2e-6)
KEY_SETS = [(0,), (0, 1, 2, 3), (1, 40)]  # 40: past every row's end (contributes 0)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def run(request):
    model = tiny_model(request.param)
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
    full = []  # per layer: the float64 measures of the whole layer
    for layer in range(adapter.ModelInfo.of(model).n_layers):
        full.append(naive_measures(cache[hook_names.pattern(layer)], cache[hook_names.values(layer)],
                                   wrap(model).W_O(layer), mask.bool()))
    return model, tokens, mask, full


def expected(full, mask, keys, metric, kind):
    """``[layer, batch, head, query]``: the metric summed over the keys ``first real + keys``."""
    name = metric if metric == "attention" else f"{metric}_{kind}"
    w = torch.stack([f[name] for f in full])  # [L, b, h, q, k]
    first = mask.int().argmax(-1)
    out = torch.zeros(w.shape[:4], dtype=w.dtype)
    for b, f in enumerate(first.tolist()):
        for k in keys:
            if f + k < w.shape[-1]:
                out[:, b] += w[:, b, :, :, f + k]
    return out


@pytest.mark.parametrize("kind", ["inter", "intra"])
@pytest.mark.parametrize("block", [None, 1, 2, 3])
def test_keyset_weight_equals_the_full_tensor_reduction(run, block, kind):
    model, tokens, mask, full = run
    res = cwlens.stream_reduce(
        model, tokens, [reducers.KeySetWeight(keys) for keys in KEY_SETS],
        kind=kind, attention_mask=mask, query_block=block)
    for keys in KEY_SETS:
        got = res["keys_" + "_".join(map(str, keys))]
        assert got.layers == tuple(range(len(full))) and got.keys == keys and got.kind == kind
        assert_close(got.query_mask, mask.bool())
        for metric in ("attention", "contribution"):
            want = expected(full, mask, keys, metric, kind)
            assert_close(got.weights[metric].double(), want, **TOL)


def test_the_first_token_set_is_the_sink_rate_and_all_keys_sum_to_one(run):
    """Identities: keys (0,) give HeadSummary's per-head sink rate and (inter) sink
    contribution (their mean over the real queries after the sink); the set of every key
    gives token-level rows of 1 for attention and the inter-head contribution on every real
    query (0 on pad queries)."""
    model, tokens, mask, _ = run
    n = tokens.shape[1]
    res = cwlens.stream_reduce(
        model, tokens, [reducers.KeySetWeight((0,)), reducers.KeySetWeight(range(n), name="all"),
                        reducers.HeadSummary()], attention_mask=mask, query_block=2)
    first = mask.bool().int().argmax(-1)
    after = mask.bool() & (torch.arange(n)[None, :] > first[:, None])
    real = after[None, :, None, :].float()
    sink = res["keys_0"].weights
    heads = res["heads"]
    assert_close((sink["attention"] * real).sum(-1) / real.sum(-1), heads.sink_rate, **TOL)
    assert_close((sink["contribution"] * real).sum(-1) / real.sum(-1), heads.sink_contribution_inter, **TOL)
    every = res["all"]
    for metric in ("attention", "contribution"):
        tok = every.token_level(metric)  # [L, b, q]
        want = mask.bool()[None].expand_as(tok).float()
        assert_close(tok, want, rtol=0, atol=2e-5)


def test_token_level_combines_heads_by_the_metric_and_kind():
    w = torch.arange(24.0).reshape(1, 1, 4, 6)  # [layer, batch, head, query]
    mask = torch.ones(1, 6, dtype=torch.bool)
    inter = reducers.KeySetResult({"attention": w, "contribution": w}, mask, (0,), (0,), "inter")
    assert_close(inter.token_level("attention"), w.mean(2))
    assert_close(inter.token_level("contribution"), w.sum(2))
    intra = reducers.KeySetResult({"contribution": w}, mask, (0,), (0,), "intra")
    assert_close(intra.token_level("contribution"), w.mean(2))
    with pytest.raises(CwlensError, match="holds \\['contribution'\\]"):
        intra.token_level("attention")


@pytest.mark.parametrize("keys", [(), (-1,), (0, 0), (True,)])
def test_bad_key_sets_are_refused(keys):
    with pytest.raises(CwlensError, match="keys"):
        reducers.KeySetWeight(keys)


def test_no_metric_is_refused():
    with pytest.raises(CwlensError, match="metric"):
        reducers.KeySetWeight((0,), metrics=())


def test_blockwise_attention_gives_the_same_key_set_weights(run):
    model, tokens, mask, _ = run
    if not wrap(model).supports_blockwise:
        pytest.skip("the blockwise path applies to TransformerLens 4.x bridges only")
    got = {}
    for attention in ("eager", "blockwise"):
        res = cwlens.stream_reduce(model, tokens, [reducers.KeySetWeight(range(4))], attention_mask=mask,
                                   query_block=3, attention=attention)
        got[attention] = res["keys_0_1_2_3"].weights
    for metric in ("attention", "contribution"):
        assert_close(got["blockwise"][metric], got["eager"][metric], **TOL)
