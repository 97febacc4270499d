"""``reducers.TopK`` never returns a key its query does not attend to (#39.5): not a key
after the query on a decoder, not a pad key, not a key outside a sliding window. A row
with fewer such keys than ``k`` ends in entries marked index -1 / value NaN
(``TopKResult.valid``). On the old code query 0 of a decoder listed ``[0, 10, 11, 9]``
with values ``[0.125, -0.0, -0.0, -0.0]``."""

import pytest
import torch

import cwlens
from cwlens import reducers
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.engine.tokens import text_length
from cwlens.testing import tiny_model

from ._masked_topk import attended

TEXT = "mary gave john a bottle of milk when they went to the store"
METRICS = ("contribution", "attention", "value_weighted", "value_weighted_output_normalized")


@pytest.fixture(scope="module", params=["llama", "gpt2", "gemma3", "bert"])
def model(request):
    return tiny_model(request.param)


def _tops(model, input, k, **kw):
    rs = [reducers.TopK(k, m) for m in METRICS] + [
        reducers.TopK(k, "contribution", by_abs=True, name="abs"),
        reducers.TopK(k, "contribution", sum_heads=True, name="tokens")]
    return cwlens.stream_reduce(model, input, rs, **kw)


@pytest.mark.parametrize("query_block", [None, 3])
def test_decoder_query_i_lists_exactly_its_keys(model, query_block):
    """Query ``i`` of a decoder sees keys ``0..i`` (inside the window): with ``k`` = the
    text's length, its row holds exactly those keys, then -1 / NaN."""
    n = text_length(wrap(model), TEXT)
    out = _tops(model, TEXT, n, query_block=query_block)
    encoder = cwlens.wrap(model).is_encoder
    for name in out.results:
        top = out[name]
        assert top.indices.shape[-1] == n
        for li, layer in enumerate(top.layers):
            seen = attended(model, n, layer)[0, 0]  # [query, key]
            for q in range(n):
                keys = top.indices[li, 0, :, q]  # [head, k]
                want = seen[q].nonzero().flatten().tolist()
                for h in range(keys.shape[0]):
                    row = keys[h].tolist()
                    got = [j for j in row if j >= 0]
                    assert sorted(got) == want, (name, layer, q, h, row)
                    assert row[len(got):] == [-1] * (n - len(got))  # the marked entries last
        if not encoder:
            first = top.indices[:, 0, :, 0]  # query 0: exactly one valid key, key 0
            assert bool((first[..., 0] == 0).all()) and bool((first[..., 1:] == -1).all())
            assert bool(top.values[:, 0, :, 0, 1:].isnan().all())
        assert torch.equal(top.valid, top.indices >= 0)
        assert torch.equal(top.valid, ~top.values.isnan())


def test_rows_are_ranked_among_their_own_keys(model):
    """With fewer positive entries than ``k`` the old ranking put masked zeros above the
    real negative contributions; they are ranked among the query's keys only."""
    n = text_length(wrap(model), TEXT)
    out = cwlens.stream_reduce(model, TEXT, [reducers.TopK(4, "contribution")])
    got = cwlens.stream(model, TEXT, lambda ly, w: w.clone())
    top = out["top4_contribution"]
    for li, w in enumerate(got):
        allowed = attended(model, n, li).expand(w.shape)
        score = w.masked_fill(~allowed, float("-inf")).topk(4, dim=-1)
        want = score.values.masked_fill(score.values == float("-inf"), float("nan"))
        torch.testing.assert_close(top.values[li], want, equal_nan=True, rtol=1e-5, atol=2e-6)


def test_the_keys_a_query_may_list_are_where_the_model_attends(model):
    """The engine's rule (real query and key, causal, sliding window) is the model's own:
    the support of the streamed attention on a padded batch."""
    tokens, mask = pad_batch(model, [TEXT, "the cat sat", "a dog ran to the big red house"])
    atts = cwlens.stream(model, tokens, lambda ly, w: w.clone(), metric="attention",
                         attention_mask=mask)
    for layer, a in enumerate(atts):
        assert torch.equal(a > 0, attended(model, tokens.shape[1], layer, mask).expand(a.shape))


def test_k_above_the_length_gives_one_entry_per_key(model):
    out = cwlens.stream_reduce(model, "the cat sat", [reducers.TopK(50, "attention")])
    top = out["top50_attention"]
    n = text_length(wrap(model), "the cat sat")
    assert top.indices.shape[-1] == n
    per_query = (top.indices >= 0).sum(-1)[0, 0, 0]  # [query]
    if cwlens.wrap(model).is_encoder:
        assert per_query.tolist() == [n] * n
    else:
        assert per_query.tolist() == list(range(1, n + 1))


def test_the_table_lists_valid_entries_only(model):
    out = cwlens.stream_reduce(model, TEXT, [reducers.TopK(5, "contribution")])
    top = out["top5_contribution"]
    df = top.to_dataframe()
    assert list(df.columns) == ["layer", "batch", "head", "query", "rank", "key", "value"]
    assert len(df) == int(top.valid.sum())
    assert not df.value.isna().any() and (df.key >= 0).all()
    if not cwlens.wrap(model).is_encoder:
        assert (df.key <= df["query"]).all()
    row = df.iloc[len(df) // 2]
    want = top.values[int(row.layer), int(row.batch), int(row["head"]), int(row["query"]), int(row["rank"])]
    assert float(row.value) == pytest.approx(float(want))


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("by_abs", [False, True])
def test_row_topk_equals_a_masked_topk_on_random_rows(grouped, by_abs, monkeypatch):
    """The plain top-k first, then only the rows where it picked a key left out ranked again:
    the same as ranking every row with those keys at -inf (random signed rows and random
    allowed keys, rows with no key at all, rows with fewer keys than k)."""
    from cwlens.engine import row_topk

    if grouped:
        monkeypatch.setattr(row_topk, "GROUPED_FROM", 1)
        monkeypatch.setattr(row_topk, "COLUMNS", 3)
    g = torch.Generator().manual_seed(0)
    for k, width in [(4, 17), (3, 40), (8, 5)]:
        w = torch.randn(2, 3, 6, width, generator=g)
        allowed = torch.rand(2, 1, 6, width, generator=g) < 0.3
        allowed[0, 0, 0] = False  # a pad query: no key
        allowed[1, 0, 1] = True  # every key
        idx, val = row_topk._row_topk(w, k, by_abs, None, allowed)
        score = (w.abs() if by_abs else w).masked_fill(~allowed, float("-inf"))
        top = score.topk(min(k, width), dim=-1)
        valid = top.values > float("-inf")
        torch.testing.assert_close(val, w.gather(-1, top.indices).masked_fill(~valid, float("nan")),
                                   equal_nan=True)
        assert torch.equal(idx >= 0, valid)
        assert bool(allowed.expand(w.shape).gather(-1, idx.clamp_min(0))[valid].all())
