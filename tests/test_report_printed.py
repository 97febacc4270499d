"""Printed lists and tables (the report, ``cwlens analyze``'s summary, ``cwlens demo``) list
only keys their query sees, each as ``position:token`` (issue #39.5, printed side).

A decoder's query i sees keys 0..i; a fixed-width top-k filled its short rows with the
keys after the query (value -0.0), and the report printed query 1's top list as
``' but' +0.00``: a future token, without its position, with a zero that is no weight."""

import html
import math
import re

import pytest
import torch

from cwlens.report import analyze_text, render_report
from cwlens.testing import tiny_model

TEXT = "when mary and john went to the store , john gave a bottle of milk to mary ."
ENTRY = re.compile(r"(\d+):('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\") ([+-]\d\.\d+(?:e[+-]\d+)?)")


def _entries(text: str) -> list[tuple[int, str, float]]:
    return [(int(j), tok, float(v)) for j, tok, v in ENTRY.findall(text)]


@pytest.fixture(scope="module")
def decoder():
    return tiny_model("llama")


def test_a_decoder_query_lists_only_the_keys_it_sees(decoder):
    a = analyze_text(decoder, TEXT, window=None, top_k=5)
    n = len(a.str_tokens)
    for layer in range(a.n_layers):
        first = a.top_tokens(layer, 0, 5)
        assert [j for j, _, _ in first] == [0]  # query 0 sees itself alone
        assert first[0][2] == pytest.approx(1.0, abs=1e-5)  # so it carries the whole output
        assert len(a.top_tokens(layer, 1, 5)) == 2
        for q in range(n):
            keys = [j for j, _, _ in a.top_tokens(layer, q, 5)]
            assert len(keys) == min(5, q + 1) and all(0 <= j <= q for j in keys), (layer, q, keys)
    # the marked entries of the fixed-width result: -1 and NaN, nothing else
    hidden = a.top_keys < 0
    assert bool(hidden[:, 0, 1:].all()) and not bool(hidden[:, 5:].any())
    assert bool(a.top_values[hidden].isnan().all()) and bool(a.top_values[~hidden].isfinite().all())


def test_an_encoder_query_lists_keys_after_it():
    a = analyze_text(tiny_model("bert"), TEXT, window=None, top_k=3)
    assert not a.causal
    assert any(j > 0 for j, _, _ in a.top_tokens(0, 0, 3)) and len(a.top_tokens(0, 0, 3)) == 3


def test_the_report_tables_and_summary_show_positions_and_no_future_key(decoder, tmp_path):
    a = analyze_text(decoder, TEXT, window=None, top_k=5)
    page = render_report(a, tmp_path / "r.html").read_text(encoding="utf-8")
    body = page.split("Top contributing tokens per query", 1)[1].split("<tbody>", 1)[1]
    body = body.split("</tbody>", 1)[0]  # that table only (the graph tab follows)
    rows = re.findall(r"<tr>(.*?)</tr>", body)
    assert len(rows) == len(a.str_tokens)
    for row in rows:
        cells = [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row)]
        query = int(cells[0].split(":", 1)[0])
        for cell in cells[1:]:
            listed = _entries(cell)
            assert listed, cell  # every entry is position:token value
            assert len(listed) == min(3, query + 1), (query, cell)
            assert all(j <= query for j, _, _ in listed), (query, cell)
            assert all(tok == repr(a.str_tokens[j]) for j, tok, _ in listed)
    summary = "\n".join(a.summary_lines())
    last = len(a.str_tokens) - 1
    assert f"({last}:{a.str_tokens[last]!r};" in summary
    assert len(_entries(summary.split("heads summed):", 1)[1])) == 3 * len({0, 1})  # 2 layers x 3


def test_printed_helpers_leave_out_every_marking_of_a_hidden_key():
    from cwlens.report.printed import entry_list, listed_entries, row_top, signed, visible_keys

    # a fixed-width top-k row of query 2: index past the query, -1, NaN, an invalid flag
    keys = torch.tensor([2, 5, -1, 0, 1, 3])
    values = torch.tensor([0.5, -0.0, 0.0, float("nan"), 0.25, 0.1])
    valid = torch.tensor([True, True, True, True, True, False])
    assert listed_entries(keys, values, 2, 6, causal=True, valid=valid) == [(2, 0.5), (1, 0.25)]
    assert listed_entries(keys, values, 2, 6, causal=False) == [(2, 0.5), (5, 0.0), (1, 0.25), (3, pytest.approx(0.1))]
    # a pad key (attention mask 0) is seen by no query
    pads = torch.tensor([0, 1, 1, 1, 1, 1])
    assert not bool(visible_keys(4, 6, True, pads)[0]) and visible_keys(4, 6, True, pads).sum() == 4
    row = torch.tensor([0.9, -0.05, 0.0, 0.7, 0.6])
    assert row_top(row, 1, 5, causal=True, by_abs=True) == [(0, pytest.approx(0.9)), (1, pytest.approx(-0.05))]
    assert [j for j, _ in row_top(row, 4, 2, causal=True, key_mask=torch.tensor([0, 1, 1, 1, 1]))] == [3, 4]
    # a tiny real weight is not printed as a zero; a signed zero is
    assert signed(2.1e-5) == "+2.1e-05" and signed(-0.0) == "+0.000" and signed(0.0344) == "+0.034"
    assert entry_list([(12, 0.25)], ["x"] * 12 + [" the"]) == "12:' the' +0.250"
    assert entry_list([], []) == "(none)"
    assert not math.isnan(float(signed(-3e-9)))


def test_the_demo_lists_no_zero_padding(decoder, tmp_path, capsys):
    from cwlens.report.demo import run_demo

    run_demo(model=decoder, model_name="tiny-llama", out_dir=tmp_path, png=False, n_heads=2,
             max_tokens=6)
    out = capsys.readouterr().out
    lists = [line for line in out.splitlines() if line.strip().startswith(("top attended", "top contributing"))]
    assert len(lists) == 4
    for line in lists:
        listed = _entries(line)
        assert len(listed) == 5 and all(j <= 5 for j, _, _ in listed), line
        assert " +0.000" not in line and " -0.000" not in line, line
    assert "lists: key:token" in out


def test_the_demo_figure_marks_masked_cells_and_titles_only_the_first_query_axis():
    """Masked cells are NaN (drawn in the grey plot background), a 0 stays a 0; the inner
    columns' "query" titles sat on their left neighbour's tick labels."""
    import numpy as np

    from cwlens.plotting import attention_vs_contribution
    from cwlens.plotting.heatmaps import MASKED_COLOUR, causal_mask

    n = 4
    att = np.tril(np.full((n, n), 0.25))
    con = np.tril(np.full((n, n), 0.1))
    con[3, 1] = 0.0  # a real zero
    heads = [dict(name=f"h{i}", attention=att, contribution=con) for i in range(3)]
    fig = attention_vs_contribution(heads, ["a", "b", "c", "d"], masked=causal_mask(n))
    assert fig.layout.plot_bgcolor == MASKED_COLOUR and "grey: masked" in fig.layout.title.text
    for trace in fig.data:
        z = np.array(trace.z, dtype=float)
        assert np.isnan(z[np.triu_indices(n, 1)]).all() and not np.isnan(z[np.tril_indices(n)]).any()
    assert np.array(fig.data[1].z, dtype=float)[3, 1] == 0.0
    titled = [ax for ax in fig.layout if ax.startswith("yaxis") and fig.layout[ax].title.text]
    assert sorted(titled) == ["yaxis", "yaxis4"]  # column 1 of both rows
    unmasked = attention_vs_contribution(heads, ["a", "b", "c", "d"])
    assert not np.isnan(np.array(unmasked.data[0].z, dtype=float)).any()
