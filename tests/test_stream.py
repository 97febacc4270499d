"""The streaming engine equals the cached path: every metric, both kinds, every tiny
architecture, left/right-padded batches; reducers equal the same reductions of the full
tensors. Runs under both TransformerLens generations (see scripts/test.sh)."""

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens import reducers
from cwlens.core._types import STREAM_METRICS
from cwlens.engine import adapter, row_topk
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.engine.models import blockwise as blockwise_models
from cwlens.errors import CwlensError, UnknownOptionError
from cwlens.testing import ARCHITECTURES, tiny_model

from ._masked_topk import check_topk

TEXTS = [
    "the cat sat on the mat",
    "mary gave john a bottle of milk when they went to the store .",
    "paris is the capital of france",
]
TOL = dict(rtol=1e-5, atol=2e-6)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def run(request):
    model = tiny_model(request.param)
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        logits, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
    return model, tokens, mask, cache, logits


def cached(cache, model, metric, kind, mask):
    if metric == "contribution_abs":
        return cwlens.importance(cache, model, None, "contribution", kind, mask).abs()
    return cwlens.importance(cache, model, None, metric, kind, mask)


@pytest.mark.parametrize("kind", ["inter", "intra"])
@pytest.mark.parametrize("metric", STREAM_METRICS)
def test_stream_equals_cached(run, metric, kind):
    model, tokens, mask, cache, _ = run
    got = cwlens.stream(model, tokens, lambda layer, w: w.clone(), metric=metric, kind=kind,
                        attention_mask=mask)
    assert_close(torch.stack(got), cached(cache, model, metric, kind, mask), **TOL)


def test_stream_geometry_keeps_logits_and_layer_order(run):
    model, tokens, mask, _, logits = run
    seen = []
    out_logits, out = cwlens.stream_geometry(
        model, tokens, lambda layer, geo: seen.append(layer) or layer, layers=[1, 0],
        attention_mask=mask,
    )
    assert out == [1, 0] and sorted(seen) == [0, 1]
    assert_close(out_logits, logits)


@pytest.mark.parametrize("block", [None, 1, 3, 1000])
def test_reducers_equal_reductions_of_full_tensors(run, block):
    model, tokens, mask, cache, _ = run
    k = 3
    res = cwlens.stream_reduce(
        model, tokens,
        [reducers.TopK(k, "contribution"), reducers.TopK(k, "attention", name="top_att"),
         reducers.TopK(k, "contribution", by_abs=True, sum_heads=True, name="top_tok_abs"),
         reducers.ColumnSums("contribution"), reducers.ColumnSums("value_weighted", sum_heads=True),
         reducers.TokenLevel(layers=[0]), reducers.HeadSummary(),
         reducers.FullMatrices([(1, 0)])],
        attention_mask=mask, query_block=block,
    )
    c = cached(cache, model, "contribution", "inter", mask)  # [L, b, h, q, k]
    a = cached(cache, model, "attention", "inter", mask)
    vw = cached(cache, model, "value_weighted", "inter", mask)

    top = res["top3_contribution"]
    assert top.layers == tuple(range(model.cfg.n_layers))
    # ranked among the keys each query attends to; the indices point at the values (ties
    # may pick other indices); fewer keys than k: -1 / NaN
    check_topk(top, c, model, k, mask=mask, **TOL)
    check_topk(res["top_att"], a, model, k, mask=mask, **TOL)
    check_topk(res["top_tok_abs"], c.sum(2, keepdim=True), model, k, by_abs=True, mask=mask, **TOL)

    assert_close(res["column_sums_contribution"].tensor, c.sum(3), **TOL)
    assert_close(res["column_sums_value_weighted"].tensor, vw.sum((2, 3)), rtol=1e-5, atol=1e-5)
    assert_close(res["token_contribution"].tensor, c[[0]].sum(2), **TOL)
    assert res["token_contribution"].layers == (0,)

    heads = res["heads"]
    real = mask.bool()
    first = real.int().argmax(-1)
    after = real & (torch.arange(real.shape[1])[None, :] > first[:, None])  # the sink's query left out
    w = after[None, :, None, :].float()  # [1, b, 1, q]
    n = w.sum(-1)
    idx = first[None, :, None, None, None].expand(*a.shape[:4], 1)
    sink_a = a.gather(-1, idx)[..., 0]
    sink_c = c.gather(-1, idx)[..., 0]
    sink_intra = cached(cache, model, "contribution", "intra", mask).gather(-1, idx)[..., 0]
    assert_close(heads.sink_rate, (sink_a * w).sum(-1) / n, **TOL)
    assert_close(heads.sink_contribution_inter, (sink_c * w).sum(-1) / n, **TOL)
    assert_close(heads.sink_contribution_intra, (sink_intra * w).sum(-1) / n, **TOL)
    assert_close(heads.output_share.sum(-1), torch.ones_like(heads.output_share.sum(-1)), **TOL)
    ent = -(a * a.clamp_min(1e-30).log()).sum(-1)
    assert_close(heads.entropy, (ent * w).sum(-1) / n, **TOL)

    mats = res["matrices"]
    assert_close(mats[(1, 0, "attention")], a[1, :, 0], **TOL)
    assert_close(mats[(1, 0, "contribution")], c[1, :, 0], **TOL)


def test_reducer_reused_gives_same_result(run):
    model, tokens, mask, _, _ = run
    r = reducers.ColumnSums("attention")
    first = cwlens.stream_reduce(model, tokens, [r], attention_mask=mask)[r.name].tensor
    second = cwlens.stream_reduce(model, tokens, [r], attention_mask=mask)[r.name].tensor
    assert_close(first, second)


def test_stream_leaves_no_hooks(run):
    model, tokens, mask, _, logits = run

    def boom(layer, w):
        raise RuntimeError("inside fn")

    def n_hooks():
        return sum(len(hp.fwd_hooks) for hp in model.hook_dict.values())

    before = n_hooks()  # the bridge keeps some hooks of its own on some architectures
    with pytest.raises(RuntimeError, match="inside fn"):
        cwlens.stream(model, tokens, boom, attention_mask=mask)
    assert n_hooks() == before
    with torch.no_grad():
        again = model(tokens, **cwlens.wrap(model).forward_kwargs(mask))
    assert_close(again, logits)


def test_bad_arguments(run):
    model, tokens, mask, _, _ = run
    with pytest.raises(UnknownOptionError, match="contribution_abs"):
        cwlens.stream(model, tokens, lambda ly, w: None, metric="contrib")
    with pytest.raises(UnknownOptionError, match="inter"):
        cwlens.stream(model, tokens, lambda ly, w: None, kind="both")
    with pytest.raises(CwlensError, match="no tokens"):
        cwlens.stream(model, tokens[:, :0], lambda ly, w: None)
    with pytest.raises(CwlensError, match="query_block"):
        cwlens.stream_reduce(model, tokens, [reducers.HeadSummary()], query_block=0)
    with pytest.raises(CwlensError, match="'auto'"):
        cwlens.stream_reduce(model, tokens, [reducers.HeadSummary()], query_block="big")
    with pytest.raises(CwlensError, match="positive"):
        reducers.TopK(k=0)


@pytest.mark.parametrize("columns", [2, 3])
def test_grouped_topk_equals_topk_on_the_rows_of_every_metric(run, columns, monkeypatch):
    """Long rows rank only the k strided groups with the largest maxima
    (row_topk.GROUPED_FROM): forced here on short rows, with a ragged tail (3 columns),
    signed and |.| ranking."""
    model, tokens, mask, cache, _ = run
    monkeypatch.setenv("CWLENS_NATIVE", "0")  # the torch path (the C kernel: test_native_topk.py)
    monkeypatch.setattr(row_topk, "GROUPED_FROM", 1)
    monkeypatch.setattr(row_topk, "COLUMNS", columns)
    k = 2
    metrics = list(STREAM_METRICS)
    calls = []
    real = row_topk._grouped_topk_indices
    monkeypatch.setattr(row_topk, "_grouped_topk_indices", lambda *a: calls.append(1) or real(*a))
    rs = [reducers.TopK(k, m) for m in metrics] + [reducers.TopK(k, "contribution", by_abs=True, name="abs")]
    res = cwlens.stream_reduce(model, tokens, rs, attention_mask=mask)
    assert calls, "the grouped path did not run"
    for m in [*metrics, "abs"]:
        full = cached(cache, model, "contribution" if m == "abs" else m, "inter", mask)
        top = res["abs" if m == "abs" else f"top{k}_{m}"]
        check_topk(top, full, model, k, by_abs=m == "abs", mask=mask, **TOL)


def test_grouped_topk_with_ties_and_negative_rows():
    g = torch.Generator().manual_seed(0)
    for width, columns, k in [(64, 8, 8), (67, 8, 8), (100, 7, 5), (33, 4, 4), (3000, 512, 8), (40, 40, 3)]:
        x = torch.randint(-5, 5, (3, 4, width), generator=g).float()  # many ties
        x[0, 0] = -1.0  # a row of one repeated negative value
        idx = row_topk._grouped_topk_indices(x, k, columns)
        assert_close(x.gather(-1, idx), x.topk(k, dim=-1).values)
        assert (idx.sort(-1).values.diff(dim=-1) > 0).all()  # k distinct keys per row
        y = torch.randn(3, 4, width, generator=g)  # no ties: the very indices of torch.topk
        assert torch.equal(row_topk._grouped_topk_indices(y, k, columns), y.topk(k, dim=-1).indices)


@pytest.mark.parametrize("native", [False, True])
def test_vwon_ranks_once_with_value_weighted(run, monkeypatch, native):
    """The output-normalised baseline orders each row as value-weighted does: one top-k of
    a block serves both reducers (torch or the C kernel)."""
    model, tokens, mask, cache, _ = run
    from cwlens.engine import native as kernel

    if native and not kernel.available():
        pytest.skip("the C kernel is not built here (no compiler)")
    monkeypatch.setenv("CWLENS_NATIVE", "1" if native else "0")
    monkeypatch.setattr(kernel, "block_measures", lambda *a, **kw: None)  # the per-metric paths (the fused one: below)
    seen = []
    name = "_native_row_topk" if native else "_row_topk"
    real = getattr(row_topk, name)
    monkeypatch.setattr(row_topk, name, lambda w, *a: seen.append(1) or real(w, *a))
    cwlens.stream_reduce(model, tokens, [reducers.TopK(2, "value_weighted"),
                                         reducers.TopK(2, "value_weighted_output_normalized")],
                         attention_mask=mask, query_block=None)
    assert len(seen) == model.cfg.n_layers


def test_vwon_ranks_once_with_value_weighted_in_the_fused_kernel(run, monkeypatch):
    """With the block's one C call (cwlens.engine.block_fused), both reducers read one call's
    lists: one call per layer and text, and no per-metric top-k."""
    model, tokens, mask, cache, _ = run
    from cwlens.engine import native as kernel

    if not kernel.available():
        pytest.skip("the C kernel is not built here (no compiler)")
    calls, real = [], kernel.block_measures
    monkeypatch.setattr(kernel, "block_measures", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(row_topk, "_native_row_topk", lambda *a: pytest.fail("ranked again"))
    monkeypatch.setattr(row_topk, "_row_topk", lambda *a: pytest.fail("ranked again"))
    cwlens.stream_reduce(model, tokens, [reducers.TopK(2, "value_weighted"),
                                         reducers.TopK(2, "value_weighted_output_normalized")],
                         attention_mask=mask, query_block=None)
    assert len(calls) == model.cfg.n_layers * tokens.shape[0]


@pytest.mark.parametrize("kind", ["inter", "intra"])
def test_topk_of_every_metric_in_blocks(run, kind):
    model, tokens, mask, cache, _ = run
    k = 4
    metrics = list(STREAM_METRICS)
    res = cwlens.stream_reduce(
        model, tokens, [reducers.TopK(k, m, by_abs=m == "contribution") for m in metrics],
        kind=kind, attention_mask=mask, query_block=2,
    )
    for m in metrics:
        full = cached(cache, model, m, kind, mask)
        check_topk(res[f"top{k}_{m}"], full, model, k, by_abs=m == "contribution", mask=mask, **TOL)


def test_streamed_closure_equals_cached_closure(run):
    model, tokens, mask, _, _ = run
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask, closure=True)
    want = cwlens.closure(cache, model, attention_mask=mask)
    _, _, got = cwlens.stream_geometry(model, tokens, lambda ly, g: None, attention_mask=mask,
                                       closure=True)
    assert got.layers == want.layers
    assert got.worst_relative_error < 1e-5
    assert_close(torch.tensor(got.relative_error), torch.tensor(want.relative_error), rtol=0.2, atol=1e-7)


def test_auto_query_block_keeps_a_block_the_size_of_256_rows_at_8192_keys():
    from cwlens.engine.streaming import auto_query_block

    assert [auto_query_block(n) for n in (1, 2048, 8192, 16384, 32768, 131072, 10**7)] == [
        256, 256, 256, 128, 64, 32, 32]


def test_on_the_cpu_an_auto_block_stays_within_glibcs_largest_mmap_threshold():
    """A CPU block of [batch x head, rows, n] float32 entries is at most CPU_BLOCK_BYTES
    (a larger one is mapped and unmapped afresh each time); CUDA keeps the per-head rule."""
    from cwlens.engine.streaming import CPU_BLOCK_BYTES, MIN_CPU_QUERY_BLOCK, auto_query_block

    for n in (2048, 4096, 8192, 16384, 32768):
        rows = auto_query_block(n, 9, "cpu")
        assert rows * 9 * n * 4 <= CPU_BLOCK_BYTES and (rows + 1) * 9 * n * 4 > CPU_BLOCK_BYTES or rows == 256
    assert auto_query_block(8192, 9, "cpu") == 113 and auto_query_block(8192, 9) == 113
    assert auto_query_block(8192, 2 * 9, "cpu") == 56  # a batch of two: half the rows
    assert auto_query_block(10**7, 9, "cpu") == MIN_CPU_QUERY_BLOCK
    assert auto_query_block(8192, 9, "cuda") == auto_query_block(8192) == 256


def forward_logits(model, tokens, mask, attention):
    """A plain forward (no reader of the probabilities) under ``attention``, default blocks."""
    from cwlens.engine import streaming

    with torch.no_grad(), streaming.attention_context(wrap(model), tokens, attention, None):
        return model(tokens, **wrap(model).forward_kwargs(mask))


@pytest.mark.parametrize("rule", ["per_head", "cpu_bytes"])
def test_the_default_query_block_follows_the_length(monkeypatch, rule):
    """query_block="auto" (the default) shrinks the blocks of long inputs, by the per-head
    entry rule and on the CPU by the byte cap (which counts batch x heads): each forced here
    on a short padded batch (3 and 2 rows a block), blockwise and eager, with the same
    results as one block per layer. Layers that run SDPA keep the per-head rule only."""
    from cwlens.engine import streaming

    model = tiny_model("llama")
    tokens, mask = pad_batch(model, TEXTS)
    b, n = tokens.shape
    if rule == "per_head":
        forced, rows = {"BLOCK_ENTRIES_PER_HEAD": 3 * n, "MIN_AUTO_QUERY_BLOCK": 1}, 3
    else:
        heads = adapter.ModelInfo.of(model).n_heads
        forced, rows = {"CPU_BLOCK_BYTES": 2 * b * heads * n * 4 + 1, "MIN_CPU_QUERY_BLOCK": 1}, 2
    for name, value in forced.items():
        monkeypatch.setattr(streaming, name, value)
    blocks = []
    real = blockwise_models.blockwise_attention
    monkeypatch.setattr(blockwise_models, "blockwise_attention",
                        lambda m, k, s=None: blocks.append((k, s)) or real(m, k, s))
    rs = lambda: [reducers.TopK(2, "contribution"), reducers.ColumnSums("contribution")]  # noqa: E731
    want = cwlens.stream_reduce(model, tokens, rs(), attention_mask=mask, query_block=None, attention="eager")
    blockwise = wrap(model).supports_blockwise  # TransformerLens 4.x only
    for attention in ("blockwise", "eager") if blockwise else ("eager",):
        got = cwlens.stream_reduce(model, tokens, rs(), attention_mask=mask, attention=attention)
        assert_close(got["top2_contribution"].values, want["top2_contribution"].values,
                     equal_nan=True, **TOL)
        assert_close(got["column_sums_contribution"].tensor, want["column_sums_contribution"].tensor, **TOL)
    # layers that run SDPA (no reader of their probabilities) are not held to the CPU cap
    sdpa_rows = rows if rule == "per_head" else streaming.DEFAULT_QUERY_BLOCK
    assert blocks == ([(rows, sdpa_rows)] if blockwise else [])
    if blockwise:
        seen, sdpa = [], torch.nn.functional.scaled_dot_product_attention
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                            lambda q, *a, **kw: seen.append(q.shape[2]) or sdpa(q, *a, **kw))
        eager = forward_logits(model, tokens, mask, "eager")
        assert_close(forward_logits(model, tokens, mask, "blockwise"), eager, rtol=0, atol=1e-4)
        assert seen and max(seen) == min(sdpa_rows, n)


def test_row_reducers_join_a_layers_blocks_when_the_layer_ends(run, monkeypatch):
    """TopK and KeySetWeight keep one tensor per finished layer, not one per block (dozens
    of small block tensors kept to the end split the CPU allocator's heap), with the
    results of one block per layer."""
    model, tokens, mask, _, _ = run
    left: dict = {"top": [], "keys": []}
    for cls, name, store in ((reducers.TopK, "top", "_idx"), (reducers.KeySetWeight, "keys", "_rows")):
        real = cls.end_layer

        def spy(self, layer, geo, real=real, name=name, store=store):
            real(self, layer, geo)
            left[name].append(max(len(v) for v in getattr(self, store).values()))
        monkeypatch.setattr(cls, "end_layer", spy)
    rs = lambda: [reducers.TopK(2, "contribution"), reducers.KeySetWeight((0, 1))]  # noqa: E731
    got = cwlens.stream_reduce(model, tokens, rs(), attention_mask=mask, query_block=2)
    n_layers = adapter.ModelInfo.of(model).n_layers
    assert left["top"][:n_layers] == [1] * n_layers and left["keys"][:n_layers] == [1] * n_layers
    want = cwlens.stream_reduce(model, tokens, rs(), attention_mask=mask, query_block=None)
    assert_close(got["top2_contribution"].values, want["top2_contribution"].values,
                 equal_nan=True, **TOL)
    assert_close(got["keys_0_1"].weights["contribution"], want["keys_0_1"].weights["contribution"], **TOL)


def test_each_reducer_releases_its_blocks_once_its_result_is_built(run, monkeypatch):
    """stream_reduce frees a TopK's per-block rows right after its result (so that every
    reducer's blocks and every result never coexist); the result stays intact."""
    model, tokens, mask, cache, _ = run
    tops = [reducers.TopK(2, "contribution"), reducers.TopK(2, "attention")]
    sizes = []
    real = reducers.TopK.result
    monkeypatch.setattr(reducers.TopK, "result",
                        lambda self: sizes.append([len(t._idx) for t in tops]) or real(self))
    res = cwlens.stream_reduce(model, tokens, tops, attention_mask=mask, query_block=2)
    n_layers = model.cfg.n_layers
    assert sizes == [[n_layers, n_layers], [0, n_layers]]  # the first released before the second
    c = cached(cache, model, "contribution", "inter", mask)
    check_topk(res["top2_contribution"], c, model, 2, mask=mask, **TOL)


@pytest.mark.parametrize("layers", [[], [0, 0], [0, -2]])
def test_stream_refuses_an_empty_or_repeated_layer_list(layers):
    """stream/stream_geometry accepted [0, 0] (fn called twice for one layer) and raised a
    raw ValueError on []; they now refuse both as contribution_weights does."""
    from cwlens.errors import LayerOutOfRangeError
    from cwlens.testing import tiny_model

    model = tiny_model("llama")  # 2 layers: -2 is layer 0
    tokens = model.to_tokens("the cat sat")
    for run in (lambda: cwlens.stream(model, tokens, lambda *a: None, layers=layers),
                lambda: cwlens.stream_geometry(model, tokens, lambda *a: None, layers=layers)):
        with pytest.raises(LayerOutOfRangeError):
            run()


@pytest.mark.parametrize("texts", ["the cat", None, [1, 2], [torch.tensor(5)]])
def test_pad_batch_refuses_a_bare_string_or_loose_numbers(texts):
    """pad_batch(model, "the cat") batched 7 one-character texts, [1, 2] two one-token rows,
    and None raised a raw TypeError; each now names the mistake."""
    from cwlens.errors import InvalidArgumentError

    model = tiny_model("llama")
    with pytest.raises(InvalidArgumentError, match="pass"):
        pad_batch(model, texts)
    tokens, mask = pad_batch(model, [[1, 2, 3], torch.tensor([4, 5])])  # id lists still work
    assert mask.tolist() == [[1, 1, 1], [0, 1, 1]]
