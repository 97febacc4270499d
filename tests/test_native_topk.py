"""The C top-k (cwlens.engine.native.row_topk) against torch.topk, and the streamed top-k
lists with and without it: the same values everywhere, the same keys where no two values
tie (the kernel keeps equal values in key order; torch.topk's order among them is its own).
"""

import shutil

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.engine import native, reducers
from cwlens.testing import tiny_model

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: cwlens ranks with torch")


def _masked_topk(score, k, lo, hi):
    """torch's reference: keys outside [lo, hi) at -inf, then -1 / NaN where a row has fewer."""
    q, width = score.shape[-2:]
    j = torch.arange(width)
    out = (j[None, :] < lo[:, None]) | (j[None, :] >= hi[:, None])
    val, idx = score.masked_fill(out, float("-inf")).topk(min(k, width), dim=-1)
    short = torch.isinf(val)
    return idx.masked_fill(short, -1), val.masked_fill(short, float("nan"))


@pytest.mark.parametrize("by_abs", [False, True])
@pytest.mark.parametrize("width", [1, 5, 16, 17, 100, 2049])
def test_equals_torch_topk(width, by_abs):
    g = torch.Generator().manual_seed(width)
    x = torch.randn(2, 3, 7, width, generator=g)
    scale = torch.rand(2, 3, width, generator=g) + 0.1
    q = x.shape[-2]
    lo = torch.randint(0, max(width // 3, 1), (q,), generator=g)
    hi = torch.minimum(lo + torch.randint(0, width + 1, (q,), generator=g), torch.tensor(width))
    for s in (None, scale):
        for bounds in ((None, None), (lo, hi)):
            k = 8
            idx, val = native.row_topk(x, k, by_abs, s, *bounds)
            score = x if s is None else x * s[:, :, None, :]
            score = score.abs() if by_abs else score
            b_lo = torch.zeros(q, dtype=torch.long) if bounds[0] is None else bounds[0]
            b_hi = torch.full((q,), width) if bounds[1] is None else bounds[1]
            want_idx, want_val = _masked_topk(score, k, b_lo, b_hi)
            n = want_idx.shape[-1]
            assert_close(val[..., :n], want_val, equal_nan=True, rtol=0, atol=0)
            assert torch.equal(idx[..., :n].long(), want_idx)  # random floats: no ties
            assert (idx[..., n:] == -1).all() and val[..., n:].isnan().all()


def test_ties_come_in_key_order():
    x = torch.tensor([[[[0.0, 2.0, 1.0, 2.0, 0.0, 2.0]]]])
    idx, val = native.row_topk(x, 4)
    assert idx.flatten().tolist() == [1, 3, 5, 2]
    assert val.flatten().tolist() == [2.0, 2.0, 2.0, 1.0]


def test_empty_rows_and_k_zero_are_marked_not_garbage():
    idx, val = native.row_topk(torch.zeros(1, 1, 3, 0), 2)
    assert (idx == -1).all() and val.isnan().all() and idx.shape == (1, 1, 3, 2)
    idx, val = native.row_topk(torch.zeros(1, 1, 3, 4), 0)
    assert idx.shape == (1, 1, 3, 0) and val.shape == (1, 1, 3, 0)


def test_a_metric_of_ones_own_with_nan_is_ranked_by_torch(monkeypatch):
    """Registered metrics are not checked for NaN by cwlens; the kernel assumes finite values,
    so such a block goes to torch (which ranks NaN first, as torch.topk does)."""
    from cwlens.core import metrics as M

    def nan_attention(geo, kind):
        out = geo.pattern.clone()
        out[..., 1] = float("nan")
        return out

    model = tiny_model("llama")
    tokens = torch.randint(3, 50, (1, 8))
    metric = M.Metric(name="nan_attention", math="a_ij, NaN at key 1", look=M.Look("nan", "nan", "#000000"),
                      compute=nan_attention)
    with M.registered(metric):
        fast = cwlens.stream_reduce(model, tokens, [reducers.TopK(2, "nan_attention")], query_block=4)
        monkeypatch.setenv("CWLENS_NATIVE", "0")
        slow = cwlens.stream_reduce(model, tokens, [reducers.TopK(2, "nan_attention")], query_block=4)
    assert torch.equal(fast["top2_nan_attention"].indices, slow["top2_nan_attention"].indices)


def test_refuses_what_it_cannot_rank():
    with pytest.raises(ValueError, match="float32 CPU"):
        native.row_topk(torch.zeros(1, 2, 3, dtype=torch.float64), 2)
    with pytest.raises(ValueError, match="scale"):
        native.row_topk(torch.zeros(1, 2, 3, 4), 2, scale=torch.zeros(1, 2, 5))


@pytest.mark.parametrize("name", ["llama", "gemma3", "gpt2", "bert"])
def test_streamed_topk_lists_equal_with_and_without_the_kernel(name, monkeypatch):
    """Every metric's top-k lists (causal rows, Gemma-3's sliding window of 8, BERT's
    bidirectional rows, a batch of one length and a padded one: left padding on decoders,
    right on BERT) with the kernel equal the torch path's."""
    model = tiny_model(name)
    torch.manual_seed(0)
    tokens = torch.randint(3, model.cfg.d_vocab, (2, 21))
    texts = ["the cat sat on the mat and then it slept for a while", "paris is the capital of france ."]
    metrics = ("contribution", "attention", "value_weighted", "value_weighted_output_normalized")
    calls = []
    real = native.row_topk
    monkeypatch.setattr(native, "row_topk", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    # this kernel alone: the fused one gives every block back (it: test_block_fused.py)
    monkeypatch.setattr(native, "block_measures", lambda *a, **kw: None)

    def lists(input):
        rs = [reducers.TopK(5, m) for m in metrics] + [reducers.TopK(4, "contribution", by_abs=True, name="abs")]
        out = cwlens.stream_reduce(model, input, rs, query_block=4)
        return {n: out[n] for n in out.keys()}

    for input, ranked_natively in ((tokens, True), (texts, True)):
        calls.clear()
        monkeypatch.setenv("CWLENS_NATIVE", "1")
        fast = lists(input)
        assert bool(calls) == ranked_natively
        monkeypatch.setenv("CWLENS_NATIVE", "0")
        slow = lists(input)
        for n in fast:
            assert_close(fast[n].values, slow[n].values, equal_nan=True, rtol=1e-6, atol=1e-7)
            assert torch.equal(fast[n].indices, slow[n].indices), n


def test_without_the_kernel_torch_ranks(monkeypatch, tmp_path):
    """CWLENS_NATIVE=0 (or no compiler, or a build that fails) leaves the kernel out:
    available() is False and the top-k lists come from torch."""
    from cwlens.engine.native import _state

    monkeypatch.setitem(_state, "lib", None)
    monkeypatch.delitem(_state, "lib")
    monkeypatch.setenv("CWLENS_NATIVE", "0")
    assert not native.available()
    with pytest.raises(RuntimeError, match="no compiled kernels"):
        native.row_topk(torch.zeros(1, 1, 2, 3), 1)
    monkeypatch.delitem(_state, "lib", raising=False)
    monkeypatch.setenv("CWLENS_NATIVE", "1")
    monkeypatch.setenv("CC", "/no/such/compiler")
    monkeypatch.setenv("PATH", str(tmp_path))  # no gcc either
    monkeypatch.setenv("CWLENS_CACHE", str(tmp_path))  # nothing built here yet
    assert not native.available()
    model = tiny_model("llama")
    out = cwlens.stream_reduce(model, torch.randint(3, 50, (1, 9)), [reducers.TopK(3)], query_block=4)
    assert out["top3_contribution"].indices.shape[-1] == 3


def test_a_mask_with_holes_is_ranked_by_torch(monkeypatch):
    """Real tokens with pad tokens between them are no range: torch ranks that block."""
    model = tiny_model("llama")
    tokens = torch.randint(3, 50, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 4] = 0
    calls = []
    real = native.row_topk
    monkeypatch.setattr(native, "row_topk", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    fast = cwlens.stream_reduce(model, tokens, [reducers.TopK(3)], attention_mask=mask, query_block=4)
    assert not calls  # (nor the fused kernel: it needs the same ranges, tests/test_block_fused.py)
    monkeypatch.setenv("CWLENS_NATIVE", "0")
    slow = cwlens.stream_reduce(model, tokens, [reducers.TopK(3)], attention_mask=mask, query_block=4)
    assert torch.equal(fast["top3_contribution"].indices, slow["top3_contribution"].indices)


@pytest.mark.parametrize("value, built", [("no", False), ("OFF", False), ("false", False),
                                          ("yes", True), ("True", True)])
def test_the_switch_takes_the_usual_words(monkeypatch, value, built):
    from cwlens.engine.native import _state

    monkeypatch.delitem(_state, "lib", raising=False)
    monkeypatch.setenv("CWLENS_NATIVE", value)
    assert native.available() == (built and shutil.which("cc") is not None)
    monkeypatch.delitem(_state, "lib", raising=False)


def test_a_misspelt_switch_is_refused(monkeypatch):
    from cwlens.engine.native import _state
    from cwlens.errors import InvalidArgumentError

    monkeypatch.delitem(_state, "lib", raising=False)
    monkeypatch.setenv("CWLENS_NATIVE", "nope")
    with pytest.raises(InvalidArgumentError, match="CWLENS_NATIVE='nope'.*0 \\(or false"):
        native.available()
    monkeypatch.delitem(_state, "lib", raising=False)


def test_no_nan_or_inf_is_written_in_the_finite_math_build():
    """The kernels are built with -ffinite-math-only, where making a NaN or an infinity is
    undefined behaviour (and isnan() may be folded to 0): a row's missing keys are -1 in
    C and NaN in Python."""
    import re

    assert "-ffinite-math-only" in native.FLAGS
    for path in (*native.SOURCES, *native.HEADERS):
        made = r"\b(NAN|INFINITY|HUGE_VALF?)\b|\b(nanf?|isnan|isinf|isfinite)\s*\("  # folded away there
        assert not re.search(made, path.read_text()), path.name
    g = torch.Generator().manual_seed(0)
    h, kv, q, width, d = 2, 1, 3, 5, 4
    lo, hi = torch.zeros(q, dtype=torch.int64), torch.tensor([1, 3, 5])  # rows of 1, 3, 5 keys
    inputs = native.BlockInputs(torch.rand(h, q, width, generator=g), torch.randn(h, q, d, generator=g),
                                native.value_panels(torch.randn(width, kv, d, generator=g)),
                                torch.rand(h, width, generator=g), torch.rand(1, q, generator=g), lo, hi)
    tops, _ = native.block_measures(inputs, 4, native.TOPK_METRICS, False, True)
    for name in native.TOPK_METRICS:
        idx, val = tops[name]
        assert idx[:, 0, 1:].eq(-1).all() and idx[:, 1, 3:].eq(-1).all() and idx[:, 2].ge(0).all(), name
        assert torch.equal(val.isnan(), idx < 0), name
    idx, val = native.row_topk(inputs.alpha, 4, lo=lo, hi=hi)
    assert torch.equal(val.isnan(), idx < 0) and idx[:, 0, 1:].eq(-1).all()


def test_a_failed_build_says_so_once(monkeypatch, tmp_path, capsys):
    """A compiler that fails: one line on stderr, once per process, naming the compiler's
    error and CWLENS_NATIVE=0; torch computes."""
    from cwlens.engine.native import _state

    cc = tmp_path / "broken-cc"
    cc.write_text("#!/bin/sh\necho 'In file included from x.c:1:' >&2\n"
                  "echo 'x.c:3:5: error: no such thing as a working compiler' >&2\nexit 1\n")
    cc.chmod(0o755)
    monkeypatch.setenv("CC", str(cc))
    monkeypatch.setenv("CWLENS_CACHE", str(tmp_path))
    monkeypatch.delitem(_state, "lib", raising=False)
    monkeypatch.delitem(_state, "told", raising=False)
    try:
        assert not native.available()
        monkeypatch.delitem(_state, "lib")  # built again: said no more
        assert not native.available()
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1, err
        assert "error: no such thing as a working compiler" in err[0] and "CWLENS_NATIVE=0" in err[0]
        assert "broken-cc" in err[0]
        model = tiny_model("llama")
        out = cwlens.stream_reduce(model, torch.randint(3, 50, (1, 9)), [reducers.TopK(3)], query_block=4)
        assert out["top3_contribution"].indices.shape[-1] == 3
    finally:
        monkeypatch.delitem(_state, "lib", raising=False)  # the next test loads the usual build again
