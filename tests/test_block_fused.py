"""The streamed pass's one C call per block (cwlens.engine.block_fused, block_measures.c)
against the torch path it replaces, and the kernel against float64 references: the same
top-k lists (values to float rounding, keys exactly, equal values in key order) and the
same column sums, on causal, sliding-window, bidirectional and padded rows, in blocks and
whole, inter and intra, with and without AVX-512."""

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.engine import native, reducers
from cwlens.engine.handle import wrap
from cwlens.testing import tiny_model

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: cwlens computes with torch")

METRICS = ("contribution", "attention", "value_weighted", "value_weighted_output_normalized")


def _reducers(k: int):
    return ([reducers.TopK(k, m) for m in METRICS] + [reducers.ColumnSums(m) for m in METRICS]
            + [reducers.ColumnSums("contribution", sum_heads=True, name="summed")])


def _both(monkeypatch, model, input, rs, **kw):
    """The run with the fused kernel (checked to have served it), then the torch path's."""
    calls, real = [], native.block_measures
    monkeypatch.setattr(native, "block_measures", lambda *a, **k: calls.append(1) or real(*a, **k))
    fast = cwlens.stream_reduce(model, input, rs, **kw)
    assert calls, "the fused kernel did not run"
    monkeypatch.setenv("CWLENS_NATIVE", "0")
    slow = cwlens.stream_reduce(model, input, rs, **kw)
    monkeypatch.setenv("CWLENS_NATIVE", "1")
    return fast, slow


def _assert_equal_results(fast, slow):
    for name in fast.keys():
        a, b = fast[name], slow[name]
        if hasattr(a, "indices"):
            assert torch.equal(a.indices, b.indices), name
            assert_close(a.values, b.values, equal_nan=True, rtol=1e-5, atol=1e-7)
        else:
            assert_close(a.tensor, b.tensor, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["llama", "gemma3", "gpt2", "bert"])
@pytest.mark.parametrize("kind", ["inter", "intra"])
def test_streamed_results_equal_the_torch_path(name, kind, monkeypatch):
    """Causal rows, Gemma-3's sliding window of 8, BERT's bidirectional rows; one length and
    a padded batch (left padding on decoders, right on BERT); blocks of 3 rows (tiles of 8
    cut short) and whole layers; eager and (TL 4.x) blockwise attention."""
    model = tiny_model(name)
    torch.manual_seed(0)
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 21))
    texts = ["the cat sat on the mat and then it slept for a while", "paris is the capital of france ."]
    for input in (tokens, texts):
        for query_block in (3, None):
            fast, slow = _both(monkeypatch, model, input, _reducers(5), kind=kind, query_block=query_block)
            _assert_equal_results(fast, slow)


@pytest.mark.parametrize("k", [1, 16, 17, 40])
def test_every_k_and_several_at_once(k, monkeypatch):
    """k = 1, 16 (the vector path's largest), 17 (the plain path), more than the keys (rows
    end in -1 / NaN), and two k of one metric from one call (the larger list, cut)."""
    model = tiny_model("llama")
    tokens = torch.randint(3, model.cfg.d_vocab, (1, 30))
    rs = _reducers(k) + [reducers.TopK(2, "contribution", name="two")]
    fast, slow = _both(monkeypatch, model, tokens, rs, query_block=7)
    _assert_equal_results(fast, slow)
    assert fast["two"].indices.shape[-1] == 2
    assert torch.equal(fast["two"].indices, fast[f"top{k}_contribution"].indices[..., :2]) or k < 2


@pytest.mark.filterwarnings("ignore:The input has 300 tokens")
def test_blockwise_long_rows_equal_the_torch_path(monkeypatch):
    """Rows of 300 keys (segments of 256 keys, tiles whose keys end mid-vector) under
    blockwise attention where the bridge has it."""
    model = tiny_model("llama")
    tokens = torch.randint(3, model.cfg.d_vocab, (1, 300))
    kw = {"attention": "blockwise"} if wrap(model).supports_blockwise else {}
    fast, slow = _both(monkeypatch, model, tokens, _reducers(8), query_block=37, **kw)
    _assert_equal_results(fast, slow)


def _reference(alpha, u, v, vnorm, inv1, lo, hi, k):
    """float64 references: the three metrics with keys outside [lo, hi) left out, and their sums."""
    h, q, width = alpha.shape
    group = h // v.shape[1]
    a, dot = alpha.double(), torch.einsum("hqd,khd->hqk", u.double(), v.double().repeat_interleave(group, 1))
    keys = torch.arange(width)
    inside = (keys[None, :] >= lo[:, None]) & (keys[None, :] < hi[:, None])
    c = (a * dot) * inside
    vw = a * vnorm.double()[:, None, :width]
    tops = {}
    for name, x in (("contribution", c), ("attention", a * inside), ("value_weighted", vw * inside)):
        val, idx = x.masked_fill(~inside, float("-inf")).topk(min(k, width), -1)
        short = torch.isinf(val)
        tops[name] = (idx.masked_fill(short, -1), val.masked_fill(short, float("nan")))
    cols = torch.stack([c.sum(1), (a * inside).sum(1), (a * inside * inv1.double()[..., None]).sum(1)])
    return tops, cols


@pytest.mark.parametrize("width, d, lo_hi", [(5, 3, "causal"), (16, 64, "causal"), (45, 7, "window"),
                                             (300, 16, "empty"), (1000, 64, "full")])
def test_kernel_equals_a_float64_reference(width, d, lo_hi):
    """block_measures against float64: values to float32 rounding, keys exactly (random
    values: no ties), the sums; rows with no key (lo = hi) are all -1 / NaN."""
    g = torch.Generator().manual_seed(width)
    h, kv, q = 6, 2, 19
    alpha = torch.rand(h, q, width, generator=g).softmax(-1)
    u = torch.randn(h, q, d, generator=g)
    v = torch.randn(width, kv, d, generator=g)
    vnorm = torch.rand(h, width, generator=g) + 0.1
    inv1 = torch.rand(1, q, generator=g) + 0.5
    pos = torch.arange(width - q, width) if width >= q else torch.arange(q).clamp_max(width - 1)
    lo, hi = torch.zeros(q, dtype=torch.int64), pos + 1
    if lo_hi == "window":
        lo = (pos - 6).clamp_min(0)
    elif lo_hi == "empty":
        hi[::3] = lo[::3]
    elif lo_hi == "full":
        hi = torch.full((q,), width)
    k = 8
    tops, cols = native.block_measures(native.BlockInputs(alpha, u, native.value_panels(v), vnorm, inv1, lo, hi),
                                       k, native.TOPK_METRICS, True, True)
    ref_tops, ref_cols = _reference(alpha, u, v, vnorm, inv1, lo, hi, k)
    for name in native.TOPK_METRICS:
        idx, val = tops[name]
        ref_idx, ref_val = ref_tops[name]
        n = ref_idx.shape[-1]
        assert torch.equal(idx[..., :n].long(), ref_idx), name
        assert_close(val[..., :n].double(), ref_val, equal_nan=True, rtol=1e-5, atol=1e-6)
        assert (idx[..., n:] == -1).all() and val[..., n:].isnan().all()
    assert_close(cols.double(), ref_cols, rtol=1e-5, atol=1e-5)


def test_equal_values_come_in_key_order():
    """Uniform rows: every value ties, so the k best are the first k keys, in key order."""
    h, q, width, d = 3, 9, 70, 4
    alpha = torch.full((h, q, width), 1 / width)
    u = torch.zeros(h, q, d)  # every contribution 0: ties too
    v = torch.ones(width, 1, d)
    lo, hi = torch.zeros(q, dtype=torch.int64), torch.full((q,), width)
    inputs = native.BlockInputs(alpha, u, native.value_panels(v), torch.ones(h, width), torch.ones(1, q), lo, hi)
    tops, _ = native.block_measures(inputs, 5, native.TOPK_METRICS, False, True)
    for name in native.TOPK_METRICS:
        assert torch.equal(tops[name][0], torch.arange(5, dtype=torch.int32).expand(h, q, 5)), name


def test_a_non_finite_contribution_goes_to_torch(monkeypatch):
    """The kernel returns None on a contribution that is inf or NaN; the streamed pass then
    computes that block with torch (which refuses a non-finite measure naming the layer):
    a run whose every block is given back equals the torch path's."""
    h, q, width, d = 2, 4, 20, 3
    alpha = torch.rand(h, q, width).softmax(-1)
    u = torch.randn(h, q, d)
    u[1, 2, 0] = 3e38
    v = torch.full((width, 1, d), 3e38)
    lo, hi = torch.zeros(q, dtype=torch.int64), torch.full((q,), width)
    inputs = native.BlockInputs(alpha, u, native.value_panels(v), torch.ones(h, width), torch.ones(1, q), lo, hi)
    assert native.block_measures(inputs, 3, native.TOPK_METRICS, True, True) is None
    model = tiny_model("llama")
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 12))
    calls = []
    monkeypatch.setattr(native, "block_measures", lambda *a, **k: calls.append(1))  # None: given back
    given_back = cwlens.stream_reduce(model, tokens, _reducers(3), query_block=4)
    assert calls
    monkeypatch.setenv("CWLENS_NATIVE", "0")
    _assert_equal_results(given_back, cwlens.stream_reduce(model, tokens, _reducers(3), query_block=4))


def test_without_avx512_the_plain_path_gives_the_same(monkeypatch, tmp_path):
    """The kernel built without AVX-512 (the plain loops other CPUs run) gives the same
    lists and sums as the vector path here."""
    from cwlens.engine.native import _state

    g = torch.Generator().manual_seed(1)
    h, kv, q, width, d = 4, 2, 11, 77, 9
    alpha = torch.rand(h, q, width, generator=g).softmax(-1)
    u, v = torch.randn(h, q, d, generator=g), torch.randn(width, kv, d, generator=g)
    vnorm, inv1 = torch.rand(h, width, generator=g) + 0.1, torch.rand(h, q, generator=g) + 0.5
    lo = torch.randint(0, 20, (q,), generator=g)
    hi = torch.minimum(lo + torch.randint(0, 80, (q,), generator=g), torch.tensor(width))
    args = (native.BlockInputs(alpha, u, native.value_panels(v), vnorm, inv1, lo, hi), 6, native.TOPK_METRICS,
            True, True)
    vec_tops, vec_cols = native.block_measures(*args)
    monkeypatch.setattr(native, "FLAGS", (*native.FLAGS, "-mno-avx512f"))
    monkeypatch.setenv("CWLENS_CACHE", str(tmp_path))
    monkeypatch.delitem(_state, "lib", raising=False)
    assert native.available()
    plain_tops, plain_cols = native.block_measures(*args)
    monkeypatch.delitem(_state, "lib")  # the next test loads the usual build again
    for name in native.TOPK_METRICS:
        assert torch.equal(vec_tops[name][0], plain_tops[name][0]), name
        assert_close(vec_tops[name][1], plain_tops[name][1], equal_nan=True, rtol=1e-5, atol=1e-7)
    assert_close(vec_cols, plain_cols, rtol=1e-5, atol=1e-6)


def test_refuses_shapes_that_do_not_fit():
    alpha = torch.rand(2, 3, 10)
    lo, hi = torch.zeros(3, dtype=torch.int64), torch.full((3,), 10)
    with pytest.raises(ValueError, match="shapes do not fit"):
        inputs = native.BlockInputs(alpha, torch.rand(2, 3, 4), native.value_panels(torch.rand(10, 1, 5)),
                                    torch.rand(2, 10), torch.rand(1, 3), lo, hi)
        native.block_measures(inputs, 2, native.TOPK_METRICS, True, True)
    with pytest.raises(ValueError, match="float32"):
        inputs = native.BlockInputs(alpha.double(), torch.rand(2, 3, 4), None, torch.rand(2, 10), torch.rand(1, 3), lo, hi)
        native.block_measures(inputs, 2, ("attention",), False, False)
    inputs = native.BlockInputs(alpha, torch.rand(2, 3, 4), None, torch.rand(2, 10), torch.rand(1, 3), lo, hi)
    assert native.block_measures(inputs, 2, ("attention",), False, False) is not None
    with pytest.raises(ValueError, match="k 0"):  # no list to keep (the AVX-512 top-k would read past its 16 lanes)
        native.block_measures(inputs, 0, ("attention",), False, False)
    with pytest.raises(ValueError, match="lo must be a int64 CPU tensor \\[3\\]"):
        native.block_measures(inputs._replace(lo=lo[:2]), 2, ("attention",), False, False)
    with pytest.raises(ValueError, match="inv1 must be"):
        native.block_measures(inputs._replace(inv1=torch.rand(1, 2)), 2, ("attention",), False, False)


def test_threads_of_its_own_give_the_same(monkeypatch, tmp_path):
    """Built without OpenMP (a compiler without -fopenmp: the kernels start threads of their
    own, parallel.c), the lists and sums are those of the OpenMP build, on 1 and 2 threads."""
    from cwlens.engine.native import _state

    g = torch.Generator().manual_seed(2)
    h, kv, q, width, d = 6, 3, 21, 130, 8
    alpha = torch.rand(h, q, width, generator=g).softmax(-1)
    u, v = torch.randn(h, q, d, generator=g), torch.randn(width, kv, d, generator=g)
    vnorm, inv1 = torch.rand(h, width, generator=g) + 0.1, torch.rand(1, q, generator=g) + 0.5
    lo, hi = torch.zeros(q, dtype=torch.int64), torch.arange(width - q, width) + 1
    args = (native.BlockInputs(alpha, u, native.value_panels(v), vnorm, inv1, lo, hi), 4, native.TOPK_METRICS,
            True, True)
    threads = torch.get_num_threads()
    try:
        results = []
        for openmp in (native.OPENMP, ()):
            monkeypatch.setattr(native, "OPENMP", openmp)
            monkeypatch.setenv("CWLENS_CACHE", str(tmp_path / str(bool(openmp))))
            monkeypatch.delitem(_state, "lib", raising=False)
            for n in (1, 2):
                torch.set_num_threads(n)
                results.append(native.block_measures(*args))
    finally:
        torch.set_num_threads(threads)
        monkeypatch.delitem(_state, "lib", raising=False)
    first_tops, first_cols = results[0]
    for tops, cols in results[1:]:
        for name in native.TOPK_METRICS:
            assert torch.equal(tops[name][0], first_tops[name][0]), name
            assert_close(tops[name][1], first_tops[name][1], equal_nan=True, rtol=1e-6, atol=1e-7)
        assert_close(cols, first_cols, rtol=1e-5, atol=1e-6)  # summed in another order of parts
