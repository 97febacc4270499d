"""``StreamResult`` explains itself (#41.6): a short repr (names, what each holds, shapes),
``keys()`` / ``in`` / iteration over the names, and tidy ``to_dataframe()`` tables whose
numbers are the tensors' and, for a padded batch, each text's own rows."""

import pytest
import torch

import cwlens
from cwlens import reducers
from cwlens.engine.streaming import UnknownReducerError
from cwlens.errors import InvalidArgumentError
from cwlens.testing import tiny_model

TEXTS = ["the cat sat", "mary gave john a bottle of milk when they went to the store"]


def every_reducer():
    return [reducers.TopK(3, "contribution"), reducers.ColumnSums("contribution"),
            reducers.ColumnSums("attention", sum_heads=True), reducers.TokenLevel([0]),
            reducers.HeadSummary(), reducers.FullMatrices([(1, 0)]), reducers.KeySetWeight((0,))]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def out(model):
    return cwlens.stream_reduce(model, TEXTS, every_reducer(), closure=True)


NAMES = ["top3_contribution", "column_sums_contribution", "column_sums_attention",
         "token_contribution", "heads", "matrices", "keys_0"]


def test_names_by_keys_in_and_iteration(out):
    assert list(out.keys()) == NAMES
    assert list(out) == NAMES and len(out) == len(NAMES)
    assert "heads" in out and "top8_contribution" not in out
    assert [name for name, _ in out.items()] == NAMES
    with pytest.raises(UnknownReducerError, match="no reducer named 'top8'.*'heads'"):
        out["top8"]


def test_the_repr_is_one_line_a_result_with_names_and_shapes(out):
    text = repr(out)
    lines = text.splitlines()
    assert len(lines) == 1 + len(NAMES)
    assert "tensor(" not in text  # no tensor dumped
    assert "attention_mask [2, 14] (padded batch)" in lines[0] and "closure" in lines[0]
    for name, line in zip(NAMES, lines[1:], strict=True):
        assert line.strip().startswith(repr(name))
    assert "[layer 2, batch 2, head 4, query 14, k 3]" in lines[1]
    assert "[layer 2, batch 2, key 14]" in lines[3]  # heads summed
    assert "[layer 1, batch 2, query 14, key 14]" in lines[4]


def test_tables_hold_the_tensors_numbers(out):
    top = out["top3_contribution"]
    df = out.to_dataframe("top3_contribution")
    assert list(df.columns) == ["layer", "batch", "head", "query", "rank", "key", "value"]
    assert len(df) == int(top.valid.sum())
    cols = out.to_dataframe("column_sums_contribution")
    assert list(cols.columns) == ["layer", "batch", "head", "key", "value"]
    mask = out.attention_mask.bool()
    assert len(cols) == 2 * 4 * int(mask.sum())  # layers x heads x real keys
    summed = out.to_dataframe("column_sums_attention")
    assert set(summed["head"]) == {-1}
    tok = out.to_dataframe("token_contribution")
    sums = tok.groupby(["batch", "query"]).value.sum()
    torch.testing.assert_close(torch.tensor(sums.to_numpy()).double(), torch.ones(len(sums), dtype=torch.float64),
                               rtol=0, atol=1e-5)  # each real query's row sums to 1
    assert len(sums) == int(mask.sum())
    heads = out.to_dataframe("heads")
    assert {"layer", "head", "sink_rate", "entropy"} <= set(heads.columns) and len(heads) == 2 * 2 * 4
    keys = out.to_dataframe("keys_0")
    assert list(keys.columns) == ["layer", "batch", "head", "query", "attention", "contribution"]
    assert len(keys) == 2 * 4 * int(mask.sum())


def test_each_texts_rows_of_a_batch_table_are_its_own_table(model, out):
    for i, text in enumerate(TEXTS):
        one = cwlens.stream_reduce(model, text, every_reducer())
        for name in ("top3_contribution", "column_sums_contribution", "column_sums_attention",
                     "token_contribution", "keys_0"):
            part = out.to_dataframe(name)
            part = part[part.batch == i].drop(columns="batch").reset_index(drop=True)
            alone = one.to_dataframe(name).drop(columns="batch")
            value_cols = [c for c in alone.columns if alone[c].dtype.kind == "f"]
            key_cols = [c for c in alone.columns if c not in value_cols]
            assert part[key_cols].equals(alone[key_cols]), name
            torch.testing.assert_close(torch.tensor(part[value_cols].to_numpy()),
                                       torch.tensor(alone[value_cols].to_numpy()), rtol=1e-4, atol=2e-6)


def test_what_has_no_table_says_so(out, model):
    with pytest.raises(InvalidArgumentError, match="'matrices' holds .*no table.*result\\['matrices'\\]"):
        out.to_dataframe("matrices")
    with pytest.raises(InvalidArgumentError, match="needs a name.*'top3_contribution'"):
        out.to_dataframe()
    with pytest.raises(UnknownReducerError, match="no reducer named 'nope'"):
        out.to_dataframe("nope")
    single = cwlens.stream_reduce(model, TEXTS[0], [reducers.ColumnSums()])
    assert single.attention_mask is None
    assert len(single.to_dataframe()) == 2 * 4 * 4  # the one result: no name needed
