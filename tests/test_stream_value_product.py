"""The blockwise streamed pass (#42): where the geometry computed a block's ``alpha v``
itself, the model's attention takes it instead of computing it again
(``blockwise_math.offer_output``). That keeps every number: logits, every reducer, the
closure, on every tiny architecture, against the eager pass, in blocks of 1, 3 and 8 rows."""

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.engine import reducers
from cwlens.engine.handle import wrap
from cwlens.engine.models import blockwise_math
from cwlens.testing import ARCHITECTURES, tiny_model

TOL = dict(rtol=1e-5, atol=2e-6)
LOGITS = dict(rtol=0, atol=1e-4)


@pytest.fixture(scope="module", params=ARCHITECTURES)
def model(request):
    m = tiny_model(request.param)
    if not wrap(m).supports_blockwise:
        pytest.skip("blockwise attention needs TransformerLens 4.x")
    return m


def _tokens(model):
    torch.manual_seed(0)
    return torch.randint(3, model.cfg.d_vocab, (2, 23))  # one length: no padding mask


def _reduce(model, tokens, attention, query_block=8):
    rs = [reducers.TopK(3, m) for m in ("contribution", "attention", "value_weighted",
                                         "value_weighted_output_normalized")]
    rs += [reducers.ColumnSums("contribution"), reducers.ColumnSums("value_weighted_output_normalized"),
           reducers.HeadSummary(), reducers.TokenLevel()]
    return cwlens.stream_reduce(model, tokens, rs, query_block=query_block, closure=True,
                                attention=attention)


@pytest.mark.parametrize("query_block", [1, 3, 8])
def test_the_shared_value_product_equals_eager(model, query_block, monkeypatch):
    tokens = _tokens(model)
    eager = _reduce(model, tokens, "eager")
    used = []
    real = blockwise_math._offered
    monkeypatch.setattr(blockwise_math, "_offered", lambda *a: (lambda o: used.append(o is not None) or o)(real(*a)))
    got = _reduce(model, tokens, "blockwise", query_block)
    assert used and all(used), "the model did not take the reducers' alpha v"
    assert_close(got.logits, eager.logits, **LOGITS)
    for name in got.keys():
        a, b = got[name], eager[name]
        if hasattr(a, "indices"):
            assert_close(a.values, b.values, equal_nan=True, **TOL)
        elif hasattr(a, "tensor"):
            assert_close(a.tensor, b.tensor, rtol=1e-5, atol=1e-5)
        else:
            for field in ("sink_rate", "sink_contribution_inter", "entropy", "output_share"):
                assert_close(getattr(a, field), getattr(b, field), **TOL)
    assert got.closure.worst_relative_error < 1e-5


def test_no_value_product_without_the_contribution(model):
    """Reducers that never need alpha v (the attention's column sums) offer nothing: the
    model computes it, and the logits are the eager ones."""
    tokens = _tokens(model)
    rs = lambda: [reducers.ColumnSums("attention")]  # noqa: E731
    got = cwlens.stream_reduce(model, tokens, rs(), query_block=8, attention="blockwise")
    want = cwlens.stream_reduce(model, tokens, rs(), query_block=8, attention="eager")
    assert_close(got.logits, want.logits, **LOGITS)


def test_an_offer_is_void_once_the_rows_are_edited():
    """A hook after the reader that edits the rows in place (a mask) voids the offered
    product: attention then computes alpha v from the edited rows."""
    alpha = torch.rand(1, 2, 3, 4)
    out = torch.rand(1, 2, 3, 5)
    rows = alpha.detach()
    blockwise_math.offer_output(rows, out)
    assert blockwise_math._offered(alpha, (1, 2, 3, 5)) is out
    alpha.mul_(0.5)  # in place: the version moves on
    assert blockwise_math._offered(alpha, (1, 2, 3, 5)) is None
    assert blockwise_math._offered(torch.rand(1, 2, 3, 4), (1, 2, 3, 5)) is None  # other rows
    blockwise_math._OFFERED.set(None)
