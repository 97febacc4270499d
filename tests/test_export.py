"""Exports round-trip: what is read back equals what the streaming engine computed."""

import pandas as pd
import pytest
import torch

import cwlens
from cwlens import reducers
from cwlens.cli.main import main
from cwlens.errors import InvalidArgumentError
from cwlens.report.export import circuitsvis_heads, export_texts, read_tables, reduction_tables
from cwlens.testing import save_tiny, tiny_model

TEXTS = ["the cat sat on the mat", "paris is the capital of france ."]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_written_tables_read_back_equal(model, tmp_path, fmt):
    paths = export_texts(model, TEXTS, tmp_path, model_name="tiny", text_ids=["a", "b"], k=3,
                         token_layers=[1], fmt=fmt)
    assert set(paths) == {"topk", "column_sums", "heads", "token_level"}
    back = read_tables(tmp_path)
    for tid, text in zip("ab", TEXTS, strict=True):
        tokens = model.to_tokens(text)
        res = cwlens.stream_reduce(model, tokens, [
            reducers.TopK(3, "contribution"), reducers.TopK(3, "attention"),
            reducers.ColumnSums("contribution"), reducers.ColumnSums("attention"),
            reducers.HeadSummary(), reducers.TokenLevel([1])])
        want = reduction_tables(res, model.to_str_tokens(tokens[0]), "tiny", tid, causal=True)
        for name, df in want.items():
            got = back[name][back[name].text_id.astype(str) == tid].reset_index(drop=True)
            got["text_id"] = got["text_id"].astype(str)
            pd.testing.assert_frame_equal(got, df, check_dtype=False, rtol=1e-6)


def test_tables_hold_the_streamed_numbers(model):
    tokens = model.to_tokens(TEXTS[0])
    res = cwlens.stream_reduce(model, tokens, [reducers.TopK(2, "contribution"), reducers.TokenLevel([0])])
    tables = reduction_tables(res, model.to_str_tokens(tokens[0]), "tiny", "x")
    top = tables["topk"]
    row = top[(top.layer == 1) & (top["head"] == 2) & (top["query"] == 4) & (top["rank"] == 0)]
    assert float(row.value.iloc[0]) == pytest.approx(float(res["top2_contribution"].values[1, 0, 2, 4, 0]))
    tok = tables["token_level"]
    sums = tok.groupby("query")["value"].sum().to_numpy()
    torch.testing.assert_close(torch.tensor(sums).double(), torch.ones(len(sums), dtype=torch.float64), atol=1e-5, rtol=0)
    assert set(tok.columns) >= {"model", "text_id", "layer", "query", "key", "query_token", "key_token"}


def test_topk_rows_of_a_decoder_hold_no_key_after_the_query(model, tmp_path):
    """A query with fewer than k keys listed the later keys (value 0) at ranks below its
    own: 224 of 896 rows on a 14-token text with k = 8."""
    tokens = model.to_tokens(TEXTS[0])
    n = tokens.shape[1]
    res = cwlens.stream_reduce(model, tokens, [reducers.TopK(n, "attention")])
    dense = reduction_tables(res, model.to_str_tokens(tokens[0]), "tiny", "x")["topk"]
    assert not (dense.key > dense["query"]).any()  # TopK never returns them (index -1)
    assert res[f"top{n}_attention"].indices.min() == -1
    export_texts(model, [TEXTS[0]], tmp_path, k=n, metrics=("attention",))
    top = read_tables(tmp_path)["topk"]
    assert not (top.key > top["query"]).any()
    per_row = top.groupby(["layer", "head", "query"]).key.apply(sorted)
    assert all(keys == list(range(q + 1)) for (_, _, q), keys in per_row.items())  # every visible key
    assert (top.groupby(["layer", "head", "query"])["rank"].max()
            == top.groupby(["layer", "head", "query"]).size() - 1).all()  # ranks stay 0..k-1
    with pytest.raises(InvalidArgumentError, match="causal must be True or False"):
        reduction_tables(res, model.to_str_tokens(tokens[0]), causal="yes")


def test_cli_export(tmp_path, capsys):
    model_dir = save_tiny("llama", tmp_path)
    out = tmp_path / "ex"
    assert main(["export", "--model", str(model_dir), "--device", "cpu", "--text", TEXTS[0],
                 "--text", TEXTS[1], "--out", str(out), "--k", "2"]) == 0
    assert "topk.parquet" in capsys.readouterr().out
    assert sorted(read_tables(out)["topk"].text_id.astype(str).unique()) == ["0", "1"]
    with pytest.raises(SystemExit) as bad:  # a usage error (argparse type), like every command's
        main(["export", "--model", str(model_dir), "--text", "x", "--metrics", "nope"])
    assert bad.value.code == 2
    assert "unknown metric 'nope'; valid: " in capsys.readouterr().err


def test_circuitsvis_view(model):
    pytest.importorskip("circuitsvis")
    tokens = model.to_tokens(TEXTS[0])
    c = cwlens.stream(model, tokens, lambda layer, w: w.clone(), layers=[0])[0][0]
    view = circuitsvis_heads(c, model.to_str_tokens(tokens[0]), signed=False)
    assert "AttentionHeads" in str(view)


def test_column_sums_of_a_text_with_as_many_tokens_as_heads_stay_column_sums(model):
    """``[layer, 1, head, key]`` column sums of a text of n_heads tokens have the shape of
    a token-level table; the reducer's kind, not the shape, decides the table."""
    tokens = model.to_tokens("a b c")[:, : model.cfg.n_heads]
    assert tokens.shape[1] == model.cfg.n_heads
    res = cwlens.stream_reduce(model, tokens, [reducers.ColumnSums("contribution")])
    tables = reduction_tables(res, model.to_str_tokens(tokens[0]), "tiny", "x")
    assert set(tables) == {"column_sums"}


def test_a_second_export_into_the_same_folder_leaves_no_earlier_table(model, tmp_path):
    """An export without token_layers after one with them (or in the other format) used to
    leave token_level.parquet (or the other format's files) behind, and read_tables returned
    the old text's rows beside the new ones under the same text_id."""
    export_texts(model, [TEXTS[0]], tmp_path, model_name="tiny", k=3, token_layers=[1])
    assert (tmp_path / "token_level.parquet").is_file()
    paths = export_texts(model, [TEXTS[1]], tmp_path, model_name="tiny", k=3, fmt="csv")
    assert "token_level" not in paths
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths.values())
    back = read_tables(tmp_path)
    assert set(back) == set(paths)
    want = export_texts(model, [TEXTS[1]], tmp_path / "alone", model_name="tiny", k=3, fmt="csv")
    for name in paths:
        pd.testing.assert_frame_equal(back[name], read_tables(want[name].parent)[name])
