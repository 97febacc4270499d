"""A list of texts of different lengths gives each text the numbers it gets alone (#39.1).

Every entry point that takes a list of texts (``stream``, ``stream_geometry``,
``stream_reduce`` with each reducer, ``run_with_cache`` and the measures that read its
cache, ``export_texts``) pads the batch with a mask of its own: left for decoders, right
for encoders (``pad_batch``), on tiny models of four architectures (GQA decoder, learned
positions, sliding window + post-attention norm, encoder) and on SmolLM2. Pad positions
count neither as queries nor as keys: each text's real rows of the batch equal its
single run, and pad rows and columns are 0 (TopK: marked -1 / NaN).
"""

import dataclasses

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens import reducers
from cwlens.engine.batching import pad_batch
from cwlens.testing import tiny_model

TEXTS = [
    "the cat sat",
    "the dog ran to the big red house and the cat sat on the mat",
    "mary gave john a bottle of milk",
]
ARCHS = ("llama", "gpt2", "gemma3", "bert")  # GQA, learned positions, sliding window, encoder
TOL = dict(rtol=1e-4, atol=2e-6)


@pytest.fixture(scope="module", params=ARCHS)
def arch(request):
    model = tiny_model(request.param)
    _, mask = pad_batch(model, TEXTS)
    return request.param, model, mask.bool().cpu()


def real(mask: torch.Tensor, i: int) -> torch.Tensor:
    """The positions of text ``i`` in the padded batch."""
    return mask[i].nonzero().flatten()


def rows(t: torch.Tensor, positions: torch.Tensor, *dims: int) -> torch.Tensor:
    """``t`` at ``positions`` along each of ``dims``."""
    for d in dims:
        t = t.index_select(d, positions.to(t.device))
    return t


def pads(t: torch.Tensor, mask_row: torch.Tensor, dim: int) -> torch.Tensor:
    return t.index_select(dim, (~mask_row).nonzero().flatten().to(t.device))


def test_the_batch_is_padded_left_for_decoders_and_right_for_encoders(arch):
    name, model, mask = arch
    short = mask[0]
    assert not bool(short.all())  # the first text is the shortest: it is padded
    assert bool(short[-1]) == (name != "bert") and bool(short[0]) == (name == "bert")


@pytest.mark.parametrize("metric,kind", [("contribution", "inter"), ("contribution", "intra"),
                                         ("attention", "inter"), ("value_weighted", "inter")])
def test_stream_hands_fn_each_texts_rows_and_zero_pad_rows(arch, metric, kind):
    """``fn`` gets the padded batch (as pad_batch pads it): each text's real rows and keys
    are its single run's, the pad rows and columns are 0."""
    _, model, mask = arch
    got = cwlens.stream(model, TEXTS, lambda ly, w: w.clone(), metric=metric, kind=kind)
    assert got[0].shape[-1] == mask.shape[1]
    for i, text in enumerate(TEXTS):
        alone = cwlens.stream(model, text, lambda ly, w: w.clone(), metric=metric, kind=kind)
        pos = real(mask, i)
        for layer, (w, w1) in enumerate(zip(got, alone, strict=True)):
            assert_close(rows(w[i], pos, 1, 2), w1[0], **TOL, msg=f"text {i}, layer {layer}")
            assert float(pads(w[i], mask[i], 1).abs().sum()) == 0.0  # pad queries
            assert float(pads(w[i], mask[i], 2).abs().sum()) == 0.0  # pad keys


def test_stream_geometry_gives_the_mask_and_each_texts_logits(arch):
    _, model, mask = arch

    def grab(layer, geo):
        mask = geo.position_mask
        return None if mask is None else mask.cpu(), geo.contribution("inter").clone()

    logits, got = cwlens.stream_geometry(model, TEXTS, grab)
    for position_mask, _ in got:
        assert torch.equal(position_mask, mask)
    for i, text in enumerate(TEXTS):
        logits1, alone = cwlens.stream_geometry(model, text, grab)
        pos = real(mask, i)
        assert_close(rows(logits[i], pos, 0), logits1[0], rtol=1e-4, atol=1e-4)
        for (_, c), (_, c1) in zip(got, alone, strict=True):
            assert_close(rows(c[i], pos, 1, 2), c1[0], **TOL)


def every_reducer():
    return [
        reducers.TopK(3, "contribution"),
        reducers.TopK(3, "attention"),
        reducers.TopK(3, "contribution", by_abs=True, sum_heads=True, name="top_tokens"),
        reducers.TopK(2, "value_weighted_output_normalized"),
        reducers.ColumnSums("contribution"),
        reducers.ColumnSums("value_weighted", sum_heads=True),
        reducers.TokenLevel(),
        reducers.HeadSummary(),
        reducers.FullMatrices([(1, 0)]),
        reducers.KeySetWeight((0, 1)),
    ]


def check_topk(batch, alone, i: int, pos: torch.Tensor, mask_row: torch.Tensor) -> None:
    """Text ``i``'s rows of a batch's TopK equal its single run's: the values (NaN where
    marked), the marks, and the keys (moved by the text's padding)."""
    values, indices = rows(batch.values[:, i], pos, 2), rows(batch.indices[:, i], pos, 2).long()
    assert_close(values, alone.values[:, 0], equal_nan=True, **TOL)
    valid = indices >= 0
    assert torch.equal(valid, alone.indices[:, 0] >= 0)
    shifted = torch.where(valid, indices - int(pos[0]), -1)
    assert bool(((shifted >= 0) & (shifted < len(pos)))[valid].all())  # never a pad key
    gap = (alone.values[:, 0, ..., 1:] - alone.values[:, 0, ..., :-1]).abs() < 1e-5
    tie = torch.zeros_like(valid)
    tie[..., 1:] |= gap
    tie[..., :-1] |= gap
    same = shifted == alone.indices[:, 0].long()
    assert bool((same | tie | ~valid).all())  # the same keys (where two values tie, either)
    pad_rows = pads(batch.indices[:, i], mask_row, 2)
    assert bool((pad_rows == -1).all()) and bool(pads(batch.values[:, i], mask_row, 2).isnan().all())


@pytest.mark.parametrize("query_block", [None, 2])
def test_stream_reduce_gives_each_text_its_single_run_in_every_reducer(arch, query_block):
    _, model, mask = arch
    out = cwlens.stream_reduce(model, TEXTS, every_reducer(), query_block=query_block)
    for i, text in enumerate(TEXTS):
        one = cwlens.stream_reduce(model, text, every_reducer(), query_block=query_block)
        pos, m = real(mask, i), mask[i]
        for name in ("top3_contribution", "top3_attention", "top_tokens",
                     "top2_value_weighted_output_normalized"):
            check_topk(out[name], one[name], i, pos, m)
        for name in ("column_sums_contribution", "column_sums_value_weighted"):
            t = out[name].tensor[:, i]
            assert_close(rows(t, pos, t.ndim - 1), one[name].tensor[:, 0], **TOL)
            assert float(pads(t, m, t.ndim - 1).abs().sum()) == 0.0
        t = out["token_contribution"].tensor[:, i]
        assert_close(rows(t, pos, 1, 2), one["token_contribution"].tensor[:, 0], **TOL)
        heads, heads1 = out["heads"], one["heads"]
        for f in dataclasses.fields(heads):
            if isinstance(getattr(heads, f.name), torch.Tensor):
                assert_close(getattr(heads, f.name)[:, i], getattr(heads1, f.name)[:, 0], **TOL,
                             msg=f"HeadSummary.{f.name} of text {i}")
        for key, full in out["matrices"].items():
            assert_close(rows(full[i], pos, 0, 1), one["matrices"][key][0], **TOL)
        keys, keys1 = out["keys_0_1"], one["keys_0_1"]
        assert torch.equal(keys.query_mask[i].cpu(), m)
        for metric, w in keys.weights.items():
            assert_close(rows(w[:, i], pos, 2), keys1.weights[metric][:, 0], **TOL)
    assert torch.equal(out.attention_mask.bool().cpu(), mask)  # the batch's rows: which are real


def test_run_with_cache_of_a_list_is_read_with_its_mask(arch):
    """The cache of a list of texts remembers its mask: every measure read from it without
    a mask gives each text its single run (and equals a read with the mask passed)."""
    _, model, mask = arch
    logits, cache = cwlens.run_with_cache(model, TEXTS, closure=True)
    reads = {
        "contribution_inter": lambda c: cwlens.contribution_weights(c, model),
        "contribution_intra": lambda c: cwlens.contribution_weights(c, model, kind="intra"),
        "attention": lambda c: cwlens.importance(c, model, metric="attention"),
        "value_weighted": lambda c: cwlens.importance(c, model, metric="value_weighted"),
        "vwon": lambda c: cwlens.importance(c, model, metric="value_weighted_output_normalized"),
        "alti": lambda c: cwlens.importance(c, model, metric="alti_attention"),
        "relative_norm": lambda c: cwlens.decompose(c, model).relative_norm,
        "cosine": lambda c: cwlens.decompose(c, model, kind="intra").cosine,
    }
    batch = {name: read(cache) for name, read in reads.items()}  # [layer, batch, head, q, k]
    tok = cwlens.token_contributions(cache, model)  # [layer, batch, q, k]
    for i, text in enumerate(TEXTS):
        logits1, cache1 = cwlens.run_with_cache(model, text)
        pos = real(mask, i)
        assert_close(rows(logits[i], pos, 0), logits1[0], rtol=1e-4, atol=1e-4)
        for name, read in reads.items():
            w = batch[name][:, i]
            assert_close(rows(w, pos, 2, 3), read(cache1)[:, 0], **TOL, msg=f"{name}, text {i}")
            assert float(pads(w, mask[i], 2).abs().sum()) == 0.0
            assert float(pads(w, mask[i], 3).abs().sum()) == 0.0
        assert_close(rows(tok[:, i], pos, 1, 2), cwlens.token_contributions(cache1, model)[:, 0], **TOL)
    assert cwlens.closure(cache, model).worst_relative_error < 1e-5
    assert torch.equal(cwlens.attention_mask_of(cache).bool().cpu(), mask)
    explicit = cwlens.contribution_weights(cache, model, attention_mask=mask.long())
    assert_close(batch["contribution_inter"], explicit)
    assert cwlens.attention_mask_of(cwlens.run_with_cache(model, TEXTS[0])[1]) is None


def test_texts_of_one_length_are_not_padded(arch):
    _, model, _ = arch
    texts = ["the cat sat", "a dog ran"]
    out = cwlens.stream_reduce(model, texts, [reducers.ColumnSums()])
    assert out.attention_mask is None
    _, cache = cwlens.run_with_cache(model, texts)
    assert cwlens.attention_mask_of(cache) is None


def test_export_of_texts_of_different_lengths_equals_each_alone(tmp_path):
    from cwlens.report.export import export_texts, read_tables

    model = tiny_model("llama")
    export_texts(model, TEXTS, tmp_path / "all", text_ids=["a", "b", "c"])
    together = read_tables(tmp_path / "all")
    for tid, text in zip("abc", TEXTS, strict=True):
        export_texts(model, [text], tmp_path / tid, text_ids=[tid])
        for name, alone in read_tables(tmp_path / tid).items():
            part = together[name][together[name].text_id == tid].reset_index(drop=True)
            assert part.shape == alone.shape, name
            for col in alone.columns:
                if alone[col].dtype.kind == "f":
                    assert_close(torch.tensor(part[col].to_numpy()), torch.tensor(alone[col].to_numpy()),
                                 rtol=1e-4, atol=1e-6)
                else:
                    assert part[col].tolist() == alone[col].tolist(), (name, col)


def test_smollm2_short_text_in_a_batch_gets_its_own_sink_rate(smollm2):
    """The issue's example: the short text's sink rate was 0.216 in the batch, 0.525 alone,
    and ColumnSums was inflated (13.5 vs 8.3 at key 0)."""
    texts = ["the cat sat", "the dog ran to the big red house and the cat sat on the mat"]
    rs = lambda: [reducers.HeadSummary(), reducers.ColumnSums("contribution"),  # noqa: E731
                  reducers.TopK(4, "contribution")]
    out = cwlens.stream_reduce(smollm2, texts, rs())
    _, mask = pad_batch(smollm2, texts)
    mask = mask.bool().cpu()
    for i, text in enumerate(texts):
        one = cwlens.stream_reduce(smollm2, text, rs())
        pos = real(mask, i)
        for f in ("sink_rate", "entropy", "output_share"):
            assert_close(getattr(out["heads"], f)[:, i], getattr(one["heads"], f)[:, 0],
                         rtol=1e-3, atol=1e-4, msg=f)
        col = out["column_sums_contribution"].tensor[:, i]
        assert_close(rows(col, pos, 2), one["column_sums_contribution"].tensor[:, 0], rtol=1e-3, atol=1e-4)
        top, top1 = out["top4_contribution"], one["top4_contribution"]
        assert_close(rows(top.values[:, i], pos, 2), top1.values[:, 0], equal_nan=True, rtol=1e-3, atol=1e-4)


def test_the_sink_tables_of_a_padded_cache_use_its_mask(arch):
    """The sink analyses that read a cache (cwlens.sinks) find each text's first real token
    through the mask the cache remembers, as if it were passed."""
    import pandas as pd

    from cwlens import sinks
    from cwlens.sinks.observed import observed_bins

    _, model, mask = arch
    _, cache = cwlens.run_with_cache(model, TEXTS)
    m = mask.long()
    for table in (sinks.sink_statistics, sinks.alignment_statistics, observed_bins):
        pd.testing.assert_frame_equal(table(cache, model), table(cache, model, attention_mask=m))


def test_the_factor_table_of_a_padded_row_is_its_texts_table(arch):
    """``decompose(cache).to_dataframe`` of a padded batch's row lists its text's keys only,
    numbered from its first token, as the text's own table does; a pad query is refused."""
    from cwlens.errors import InvalidArgumentError

    _, model, mask = arch
    _, cache = cwlens.run_with_cache(model, TEXTS)
    parts = cwlens.decompose(cache, model)
    for i, text in enumerate(TEXTS):
        last = int(real(mask, i)[-1])
        got = parts.to_dataframe(batch=i, query=last)
        alone = cwlens.decompose(cwlens.run_with_cache(model, text)[1], model).to_dataframe(query=-1)
        assert got[["layer", "head", "query", "key"]].equals(alone[["layer", "head", "query", "key"]])
        cols = ["attention", "relative_norm", "cosine", "contribution"]
        assert_close(torch.tensor(got[cols].to_numpy()), torch.tensor(alone[cols].to_numpy()), **TOL)
    pad = int((~mask[0]).nonzero()[0])
    with pytest.raises(InvalidArgumentError, match="is padding"):
        parts.to_dataframe(batch=0, query=pad)


def test_a_mask_given_with_texts_is_refused_naming_both_fixes():
    from cwlens.errors import ShapeMismatchError

    model = tiny_model("llama")
    _, mask = pad_batch(model, TEXTS)
    with pytest.raises(ShapeMismatchError, match="pass the texts without a mask.*pad_batch"):
        cwlens.stream_reduce(model, TEXTS, [reducers.ColumnSums()], attention_mask=mask)
