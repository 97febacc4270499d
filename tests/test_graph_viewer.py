"""The graph's HTML viewer without a browser (issue 48.2): the page is self-contained
(no URL is loaded), carries the graph's own numbers, and ``cwlens graph`` writes it."""

import base64
import json
import re

import numpy as np
import pytest

import cwlens
from cwlens.cli.main import main
from cwlens.graphs import viewer
from cwlens.testing import save_tiny, tiny_model

TEXT = "when mary and john went to the store , john gave a bottle of milk to"


@pytest.fixture(scope="module")
def g():
    return cwlens.graph(tiny_model("llama"), TEXT, top_k=4)


def _data(html: str) -> dict:
    block = re.search(r'<script type="application/json" id="[\w-]+">(.*?)</script>', html, re.S)
    return json.loads(block.group(1))


def test_page_is_self_contained(g, tmp_path):
    path = g.save(tmp_path / "sub" / "g.html")
    html = path.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # no CDN, no link
    assert "cwlensGraphViewer" in html and "<style>" in html
    frag = g._repr_html_()
    assert frag.startswith('<div class="cwlens-graph"') and "<!DOCTYPE" not in frag
    assert frag.count("class=\"cwlens-graph\"") == 1 and g._repr_html_() != frag  # a fresh id each time


def test_payload_holds_the_graphs_numbers(g):
    data = _data(g.to_html())
    assert data["tokens"] == list(g.tokens) and data["layers"] == [1, 2]
    names = [m["name"] for m in data["metrics"]]
    assert names == ["contribution", "attention"]
    for m, h in zip(data["metrics"], (g, g.compare), strict=True):
        w = np.frombuffer(base64.b64decode(m["weight"]), "<f4").reshape(h.weight.shape)
        np.testing.assert_array_equal(np.nan_to_num(w, nan=9), np.nan_to_num(h.weight, nan=9))
        f = np.frombuffer(base64.b64decode(m["from"]), "<i2").reshape(h.weight.shape)
        np.testing.assert_array_equal(f, h.from_position)
        assert m["heads_per_edge"] == h.n_heads  # a small graph: every head
    assert "factors" in data["metrics"][0] and "factors" not in data["metrics"][1]


def test_a_large_graph_keeps_to_the_byte_budget(g, monkeypatch):
    monkeypatch.setattr(viewer, "BYTE_BUDGET", 4000)
    m = viewer.payload(g)["metrics"]
    assert m[0]["heads_per_edge"] < g.n_heads and "factors" not in m[0]


def test_a_graph_too_large_for_the_page_keeps_each_nodes_strongest_edges(g, monkeypatch):
    n_nodes = g.residual.size
    # room for the shares and 3 slots of two metrics (int16 source + float32 weight)
    monkeypatch.setattr(viewer, "BYTE_BUDGET", 2 * n_nodes * 8 + 3 * 2 * n_nodes * 6)
    m = viewer.payload(g)["metrics"]
    assert [x["top_k"] for x in m] == [2, 2] and m[0]["graph_top_k"] == 4 and m[0]["slots"] == 3
    w = np.frombuffer(base64.b64decode(m[0]["weight"]), "<f4").reshape(*g.weight.shape[:2], 3)
    np.testing.assert_array_equal(np.nan_to_num(w, nan=9), np.nan_to_num(g.weight[:, :, :3], nan=9))


def test_routes_subgraph_opens_on_its_target(g):
    data = _data(g.routes(target=5, threshold=0.03).to_html())
    assert data["route"] == {"target": 5, "threshold": 0.03, "absolute": False}


def test_cli_writes_the_page(tmp_path, capsys):
    out = tmp_path / "graph" / "x.html"
    assert main(["graph", "--model", str(save_tiny("llama", tmp_path)), "--text", TEXT,
                 "--out", str(out), "--device", "cpu", "--top-k", "3", "--compare", "none",
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "ContributionGraph(metric='contribution'" in printed and "wrote" in printed
    data = _data(out.read_text(encoding="utf-8"))
    assert [m["name"] for m in data["metrics"]] == ["contribution"]
    assert data["metrics"][0]["top_k"] == 3
