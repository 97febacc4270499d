"""The streamed pass's shortcuts equal what they replace: the column sums of the three
attention baselines are read from the block's pattern (``sum_i a_ij``, and one
matrix-vector product for the output-normalised one) instead of summing their
``[batch, head, query, key]`` tensors; they equal the column sums of the full measures of
the cached path (padded batch, both kinds, heads summed or not, eager and blockwise
attention, several query blocks)."""

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens import reducers
from cwlens.engine.batching import pad_batch
from cwlens.engine.reducers import _pattern_column_sums
from cwlens.testing import tiny_model

TEXTS = ["the cat sat on the mat", "mary gave john a bottle of milk when they went to the store .",
         "paris is the capital of france"]
BASELINES = ("attention", "value_weighted", "value_weighted_output_normalized")


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def run(request):
    model = tiny_model(request.param)
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
    return model, tokens, mask, cache


@pytest.mark.parametrize("kind", ["inter", "intra"])
@pytest.mark.parametrize("block", [None, 3])
def test_baseline_column_sums_equal_the_sums_of_the_full_measures(run, kind, block):
    model, tokens, mask, cache = run
    rs = [reducers.ColumnSums(m) for m in BASELINES] + [
        reducers.ColumnSums(m, sum_heads=True, name=f"{m}_heads") for m in BASELINES]
    res = cwlens.stream_reduce(model, tokens, rs, kind=kind, attention_mask=mask, query_block=block)
    for m in BASELINES:
        full = cwlens.importance(cache, model, None, m, kind, mask).double()  # [L, b, h, q, k]
        assert_close(res[f"column_sums_{m}"].tensor.double(), full.sum(3), rtol=1e-5, atol=1e-6)
        assert_close(res[f"{m}_heads"].tensor.double(), full.sum((2, 3)), rtol=1e-5, atol=1e-6)


def test_blockwise_column_sums_equal_the_eager_ones():
    model = tiny_model("llama")
    tokens = torch.randint(3, model.cfg.d_vocab, (1, 40), generator=torch.Generator().manual_seed(0))
    rs = lambda: [reducers.ColumnSums(m) for m in BASELINES]  # noqa: E731
    eager = cwlens.stream_reduce(model, tokens, rs(), attention="eager")
    blockwise = cwlens.stream_reduce(model, tokens, rs(), attention="blockwise", query_block=7)
    for m in BASELINES:
        assert_close(blockwise[f"column_sums_{m}"].tensor, eager[f"column_sums_{m}"].tensor,
                     rtol=1e-5, atol=1e-6)


def test_weights_without_a_geometry_are_summed_as_before():
    """A reducer handed a plain ``{metric: tensor}`` (no geometry) sums the tensor."""
    w = {"value_weighted": torch.rand(1, 2, 3, 4)}
    assert _pattern_column_sums(w, "value_weighted") is None
    r = reducers.ColumnSums("value_weighted")
    r.reset()
    r.update(0, 0, w, None)
    assert_close(r.result().tensor[0], w["value_weighted"].sum(2))
