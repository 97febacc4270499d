"""Blockwise attention (cwlens.engine.models.blockwise) equals the model's eager attention: logits,
every streamed metric, the reducers, masked and sink-intervened forwards, on every tiny
architecture with a padded batch; user hooks keep working (hook_pattern: a clear error).

Under TransformerLens 3.x (HookedTransformer: no seam) blockwise raises a clear error and
"auto" stays eager (scripts/test.sh runs this file in .venv-tl3 too)."""

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.core._types import STREAM_METRICS
from cwlens.core.bitmask import PackedMask
from cwlens.engine import adapter, reducers, streaming
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.engine.interventions import sinks
from cwlens.engine.interventions.value_masking import run_masked
from cwlens.engine.models.blockwise import current_block
from cwlens.errors import BlockwiseHookError, UnknownOptionError, UnsupportedModelError
from cwlens.testing import ARCHITECTURES, tiny_model

TEXTS = [
    "the cat sat on the mat",
    "mary gave john a bottle of milk when they went to the store .",
    "paris is the capital of france",
]
TOL = dict(rtol=1e-5, atol=2e-6)
LOGITS = dict(rtol=0, atol=1e-4)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def run(request):
    model = tiny_model(request.param)
    tokens, mask = pad_batch(model, TEXTS)
    if not wrap(model).supports_blockwise:
        pytest.skip("blockwise attention needs TransformerLens 4.x (see test_tl3_refuses)")
    return model, tokens, mask


def real(logits, mask):
    """Logits of the real positions: a pad query sees no key, and eager attention gives it
    the mean of all values, which an edit of its (uniform) pattern row changes; blockwise
    keeps that mean (pad rows never reach a real position)."""
    return logits[mask.bool()]


def forward(model, tokens, mask, attention="eager", block=3):
    with torch.no_grad(), streaming.attention_context(wrap(model), tokens, attention, block):
        return model(tokens, **wrap(model).forward_kwargs(mask))


@pytest.mark.parametrize("block", [1, 3, 256])
def test_logits_equal_eager(run, block):
    model, tokens, mask = run
    eager = forward(model, tokens, mask)
    got = forward(model, tokens, mask, "blockwise", block)
    assert_close(got, eager, **LOGITS)  # pad positions too
    assert_close(forward(model, tokens, mask), eager, rtol=0, atol=0)  # model restored


@pytest.mark.parametrize("kind", ["inter", "intra"])
@pytest.mark.parametrize("metric", STREAM_METRICS)
def test_every_metric_equals_eager(run, metric, kind):
    model, tokens, mask = run
    got = [cwlens.stream(model, tokens, lambda ly, w: w.clone(), metric=metric, kind=kind,
                         attention_mask=mask, attention=a, query_block=2) for a in ("eager", "blockwise")]
    assert_close(torch.stack(got[1]), torch.stack(got[0]), **TOL)


def test_reducers_and_closure_equal_eager(run):
    model, tokens, mask = run
    alti = "alti"  # through Gemma-3's post-attention norm too

    def reduce(attention):
        rs = [reducers.TopK(3, "contribution"), reducers.TopK(2, alti, by_abs=True, sum_heads=True),
              reducers.ColumnSums("value_weighted"), reducers.TokenLevel(), reducers.HeadSummary(),
              reducers.FullMatrices([(1, 0)])]
        return cwlens.stream_reduce(model, tokens, rs, attention_mask=mask, query_block=4,
                                    closure=True, attention=attention)

    eager, block = reduce("eager"), reduce("blockwise")
    assert_close(block.logits, eager.logits, **LOGITS)
    for name in ("top3_contribution", f"top2_{alti}"):
        assert_close(block[name].values, eager[name].values, equal_nan=True, **TOL)
    for name in ("column_sums_value_weighted", "token_contribution"):
        assert_close(block[name].tensor, eager[name].tensor, rtol=1e-5, atol=1e-5)
    for field in ("sink_rate", "sink_contribution_intra", "sink_contribution_inter", "entropy",
                  "output_share"):
        assert_close(getattr(block["heads"], field), getattr(eager["heads"], field), **TOL)
    for key, full in eager["matrices"].items():
        assert_close(block["matrices"][key], full, **TOL)
    assert block.closure.worst_relative_error < 1e-5


def test_closure_builds_each_layers_output_once_not_once_a_block(run, monkeypatch):
    """The rebuilt attention output of a layer is allocated at its first block (it was
    zeroed afresh for every block: 75 MB a block at 32768 tokens)."""
    model, tokens, mask = run
    made, new_zeros = [], torch.Tensor.new_zeros

    def counting(self, *size, **kw):
        made.append(tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else size)
        return new_zeros(self, *size, **kw)

    monkeypatch.setattr(torch.Tensor, "new_zeros", counting)
    cwlens.stream_reduce(model, tokens, [reducers.HeadSummary()], attention_mask=mask, query_block=2,
                         closure=True, attention="blockwise", logits=False)
    info = adapter.ModelInfo.of(model)
    outputs = [s for s in made if s == (tokens.shape[0], tokens.shape[1], info.d_model)]
    assert len(outputs) == info.n_layers


def test_logits_false_stops_before_the_unembedding(run):
    model, tokens, mask = run
    res = cwlens.stream_reduce(model, tokens, [reducers.ColumnSums("attention")], attention_mask=mask,
                               attention="blockwise", logits=False)
    want = cwlens.stream_reduce(model, tokens, [reducers.ColumnSums("attention")], attention_mask=mask,
                                attention="eager")
    assert res.logits is None
    assert_close(res["column_sums_attention"].tensor, want["column_sums_attention"].tensor, **TOL)


@pytest.mark.parametrize("renormalize", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_value_masking_equals_eager(run, renormalize, packed):
    model, tokens, mask = run
    n_heads = adapter.ModelInfo.of(model).n_heads
    g = torch.Generator().manual_seed(0)
    shape = (tokens.shape[0], n_heads, tokens.shape[1], tokens.shape[1])
    masks = {ly: torch.rand(shape, generator=g) < 0.3 for ly in (0, 1)}
    if packed:
        masks = {ly: PackedMask.pack(m) for ly, m in masks.items()}
    kw = dict(renormalize=renormalize, attention_mask=mask)
    eager = run_masked(model, tokens, masks, attention="eager", **kw)
    clean = forward(model, tokens, mask)
    with streaming.attention_context(wrap(model), tokens, "blockwise", 3):
        got = run_masked(model, tokens, masks, attention="eager", **kw)  # already blockwise
    assert_close(real(got, mask), real(eager, mask), **LOGITS)
    got = run_masked(model, tokens, masks, attention="blockwise", **kw)
    assert_close(real(got, mask), real(eager, mask), **LOGITS)
    assert (eager - clean).abs().max() > 1e-3  # the masks act


def test_sink_interventions_equal_eager(run):
    model, tokens, mask = run
    sink = cwlens.core.sinks.first_real_index(mask.bool())
    n_heads = adapter.ModelInfo.of(model).n_heads
    per_query = torch.rand(tokens.shape[0], n_heads, tokens.shape[1], generator=torch.Generator().manual_seed(1))
    for hooks in (sinks.sink_rate_hooks(model, 0.9, sink),
                  sinks.sink_rate_hooks(model, {0: per_query, 1: per_query * 0.5}, sink),
                  sinks.sink_value_hooks(model, 0.0, sink)):
        with sinks.applied(model, hooks):
            eager = forward(model, tokens, mask)
            got = forward(model, tokens, mask, "blockwise", 2)
        assert_close(real(got, mask), real(eager, mask), **LOGITS)
        assert (eager - forward(model, tokens, mask)).abs().max() > 1e-4  # it acts


def test_user_hooks(run):
    model, tokens, mask = run
    seen = {}

    def keeper(name):
        def keep(t, hook):
            seen[name] = t.shape
        return keep

    names = [f"blocks.1.attn.hook_{x}" for x in ("q", "k", "v", "z")] + ["blocks.1.hook_attn_out",
                                                                        "blocks.1.hook_resid_post"]
    with model.hooks(fwd_hooks=[(n, keeper(n)) for n in names]):
        forward(model, tokens, mask, "blockwise")
    assert set(seen) == set(names)
    assert all(s[1] == tokens.shape[1] for s in seen.values())  # full positions
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", keeper("pattern"))]):
        with pytest.raises(BlockwiseHookError, match="blocks.0.attn.hook_pattern.*attention='eager'"):
            forward(model, tokens, mask, "blockwise")
    assert_close(forward(model, tokens, mask, "blockwise"), forward(model, tokens, mask), **LOGITS)


def test_auto_switches_above_the_threshold(run, monkeypatch):
    model, tokens, mask = run
    assert not streaming.use_blockwise(wrap(model), tokens, "auto")
    monkeypatch.setattr(streaming, "AUTO_THRESHOLD", tokens.shape[1] - 1)
    assert streaming.use_blockwise(wrap(model), tokens, "auto")
    assert streaming.use_blockwise(wrap(model), TEXTS[1], "auto")
    with pytest.raises(UnknownOptionError, match="blockwise"):
        cwlens.stream(model, tokens, lambda ly, w: None, attention="flash")


def test_tl3_refuses():
    model = tiny_model("llama")
    if wrap(model).supports_blockwise:
        pytest.skip("TransformerLens 4.x: blockwise applies")
    tokens, mask = pad_batch(model, TEXTS)
    with pytest.raises(UnsupportedModelError, match="TransformerLens 4.x"):
        cwlens.stream(model, tokens, lambda ly, w: None, attention="blockwise")
    assert not streaming.use_blockwise(wrap(model), tokens[:, :1].repeat(1, 5000), "auto")


def test_text_report_equals_eager(run):
    from cwlens.report.analysis import analyze_text

    model, _, _ = run
    got = [analyze_text(model, TEXTS[1], window=(2, 9), query_block=3, attention=a) for a in ("eager", "blockwise")]
    for field in ("attention", "contribution", "relative_norm", "cosine", "sink_rate",
                  "sink_attention", "sink_token_contribution", "top_values"):
        assert_close(getattr(got[1], field), getattr(got[0], field), equal_nan=True, **TOL)
    for f, t in got[0].last_query.items():
        assert_close(got[1].last_query[f], t, **TOL)
    assert max(got[1].closure_error) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("name, n", [pytest.param(m, n, marks=pytest.mark.xdist_group(m))  # conftest.py
                                     for m, n in [("smollm2", 700), ("gemma3", 700), ("minilm", 300)]])
def test_real_models_equal_eager(name, n, request):
    """The real offline models: SmolLM2-135M, Gemma-3-270M past its 512-token sliding
    window, MiniLM (BERT): logits and streamed contribution column sums."""
    model = request.getfixturevalue(name)
    if not wrap(model).supports_blockwise:
        pytest.skip("the blockwise path applies to TransformerLens 4.x bridges only")
    torch.manual_seed(0)
    tokens = torch.randint(1000, 20000, (1, n))
    rs = lambda: [reducers.ColumnSums("contribution"), reducers.TopK(4, "contribution")]  # noqa: E731
    layers = [0, adapter.ModelInfo.of(model).n_layers - 1]
    eager = cwlens.stream_reduce(model, tokens, rs(), layers=layers, attention="eager")
    block = cwlens.stream_reduce(model, tokens, rs(), layers=layers, attention="blockwise", query_block=128)
    # Gemma-3's logits reach ~100: float32 rounding alone (two eager runs of one prefix at
    # 600 and 700 tokens) differs by 2.3e-4 there, SDPA blocks by 1.8e-3 (measured)
    scale = float(eager.logits.abs().max())
    assert_close(block.logits, eager.logits, rtol=0, atol=max(1e-4, 2e-5 * scale))
    # the last layer's inputs carry every earlier layer's float32 drift (Gemma-3: one column
    # sum of 5600 off by 2.6e-4, measured)
    assert_close(block["column_sums_contribution"].tensor, eager["column_sums_contribution"].tensor,
                 rtol=1e-3, atol=1e-3)
    assert_close(block["top4_contribution"].values, eager["top4_contribution"].values, rtol=1e-3,
                 atol=1e-4, equal_nan=True)


def test_blocks_come_widest_first_and_last_closes_the_layer(run):
    """A causal block's width grows with its start, so blocks are handed over last-queries
    first (each then fits in memory the one before freed); ``last`` is set on the final block
    (query_start 0) only, and the blocks tile every query once."""
    model, tokens, mask = run
    seen = []

    def record(pattern, hook):
        seen.append(current_block())

    record.cwlens_blockwise = True  # a cwlens consumer: takes query blocks
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", record)]):
        forward(model, tokens, mask, "blockwise", block=3)
    n = tokens.shape[1]
    assert [b.query_start for b in seen] == list(reversed(range(0, n, 3)))
    assert [b.last for b in seen] == [False] * (len(seen) - 1) + [True]
    assert sum(b.n_rows for b in seen) == n
    if not wrap(model).is_encoder:
        assert [b.key_stop for b in seen] == sorted((b.key_stop for b in seen), reverse=True)
