"""The graph viewer in a real browser (headless system Chromium, network cut; issue 48.2):
no console error, the side panel's rows are the Python object's incoming edges, the
sliders and toggles change what is drawn as the Python side predicts, and pages of up to
8,192 positions open and draw (their timing: scripts/benchmark_graph_page.py). Screenshots go to the test's folder, and also to
``$CWLENS_SCREENSHOTS`` where it is set (look at them)."""

import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import cwlens
from cwlens.testing import synthetic_graph, tiny_model

from ._browser import browser_page, open_file, png_stats

TEXT = "when mary and john went to the store , john gave a bottle of milk to mary ."
NODES = [(2, 17), (1, 9), (2, 4)]


def _keep(path: Path) -> None:
    where = os.environ.get("CWLENS_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(where) / path.name)


@pytest.fixture(scope="module")
def graph():
    return cwlens.graph(tiny_model("llama"), TEXT, top_k=4)


@pytest.fixture(scope="module")
def loaded(graph, tmp_path_factory):
    path = graph.save(tmp_path_factory.mktemp("browser-graph") / "graph.html")
    with browser_page(1400, 850) as (page, log):
        open_file(page, path, settle_ms=300)
        yield page, log


def _threshold(page, t: float) -> None:
    """Move the threshold slider (a log scale: its value is log10(t), -4 for 0) to ``t``."""
    _slider(page, ".cwg-threshold", math.log10(t) if t > 0 else -4)


def _slider(page, css: str, value) -> None:
    """Move a range input as a user does: its value, then the input event."""
    page.eval_on_selector(css, "(el, v) => { el.value = String(v); "
                               "el.dispatchEvent(new Event('input', {bubbles: true})); }", value)
    page.wait_for_timeout(50)


def _same_rows(js_rows, py_rows):
    assert len(js_rows) == len(py_rows)
    for a, b in zip(js_rows, py_rows, strict=True):
        assert (a["from_layer"], a["from_position"], a["rank"]) == (b["from_layer"], b["from_position"], b["rank"])
        assert abs(a["weight"] - b["weight"]) <= 1e-6
        assert abs(a["residual"] - b["residual"]) <= 1e-6
        np.testing.assert_allclose(a["heads"], b["heads"], rtol=0, atol=1e-6)


def test_page_loads_and_draws_without_a_console_error(loaded, tmp_path):
    page, log = loaded
    assert page.evaluate("typeof window.cwlensGraph.select") == "function"
    shot = tmp_path / "graph_viewer.png"
    page.screenshot(path=str(shot))
    _keep(shot)
    stats = png_stats(shot, step=4)
    assert stats["colours"] > 20 and stats["stddev"] > 5, stats
    assert log.problems() == []


def test_panel_rows_are_the_python_nodes_edges(loaded, graph):
    page, log = loaded
    for layer, pos in NODES:
        rows = page.evaluate("([l, p]) => window.cwlensGraph.select(l, p)", [layer, pos])
        _same_rows(rows, graph.node(layer, pos))
        panel = page.inner_text(".cwg-panel")
        assert f"layer {layer}, position {pos}" in panel
        assert f"{graph.node(layer, pos)[1]['weight']:+.4f}" in panel
    assert log.problems() == []


def test_clicking_a_node_opens_its_panel(loaded, graph, tmp_path):
    page, _ = loaded
    xy = page.evaluate("window.cwlensGraph.point(1, 6)")
    page.mouse.click(xy["x"], xy["y"])
    page.wait_for_timeout(100)
    assert "layer 1, position 6" in page.inner_text(".cwg-panel")
    shot = tmp_path / "graph_viewer_panel.png"
    page.screenshot(path=str(shot))
    _keep(shot)


def test_threshold_and_top_k_sliders_change_the_edges_drawn(loaded, graph):
    page, _ = loaded
    for t in (0.0, 0.03, 0.1, 0.5):
        _threshold(page, t)
        assert page.evaluate("window.cwlensGraph.visibleEdges()") == graph.visible_edges(t, 4)
    page.fill(".cwg-threshold-value", "0.005")  # the exact number, typed
    page.press(".cwg-threshold-value", "Enter")
    assert page.evaluate("window.cwlensGraph.visibleEdges()") == graph.visible_edges(0.005, 4)
    _threshold(page, 0.03)
    for k in (0, 2, 4):
        _slider(page, ".cwg-topk", k)
        assert page.evaluate("window.cwlensGraph.visibleEdges()") == graph.visible_edges(0.03, k)
    _slider(page, ".cwg-topk", 4)
    _threshold(page, 0.02)


def test_the_metric_toggle_swaps_the_weights(loaded, graph, tmp_path):
    page, _ = loaded
    layer, pos = NODES[0]
    page.select_option(".cwg-bar select", "1")
    rows = page.evaluate("([l, p]) => window.cwlensGraph.select(l, p)", [layer, pos])
    _same_rows(rows, graph.compare.node(layer, pos))
    assert page.evaluate("window.cwlensGraph.visibleEdges()") == graph.compare.visible_edges(0.02, 4)
    page.select_option(".cwg-bar select", "both")
    assert page.locator(".cwg-plot canvas").count() == 2
    shot = tmp_path / "graph_viewer_side_by_side.png"
    page.screenshot(path=str(shot))
    _keep(shot)
    page.select_option(".cwg-bar select", "0")
    rows = page.evaluate("([l, p]) => window.cwlensGraph.select(l, p)", [layer, pos])
    _same_rows(rows, graph.node(layer, pos))


def test_routes_toggle_shows_the_pythons_routes(loaded, graph, tmp_path):
    page, _ = loaded
    page.evaluate("window.cwlensGraph.select(2, -1)")
    _threshold(page, 0.04)
    page.check(".cwg-routes")
    want = graph.routes(target=-1, threshold=0.04)
    assert page.evaluate("window.cwlensGraph.visibleEdges()") == int(want.valid.sum())
    shot = tmp_path / "graph_viewer_routes.png"
    page.screenshot(path=str(shot))
    _keep(shot)
    page.uncheck(".cwg-routes")
    _threshold(page, 0.02)


def test_token_search_finds_the_positions(loaded, graph):
    page, log = loaded
    page.fill(".cwg-search", "john")
    page.press(".cwg-search", "Enter")
    found = page.evaluate("window.cwlensGraph.state.matches")
    assert found == [i for i, t in enumerate(graph.tokens) if "john" in t.lower()]
    assert log.problems() == []


def _open_long(page, log, path: Path, tmp_path: Path, name: str) -> dict:
    """Open ``path`` in the page (the browser already started, as a user's is) until the
    viewer's first drawing is done; screenshots whole and zoomed in. Its timing lives in
    scripts/benchmark_graph_page.py, not here."""
    page.goto(path.resolve().as_uri(), wait_until="load")
    page.wait_for_function("window.cwlensGraph && window.cwlensGraph.readyMs > 0", timeout=120_000)
    info = page.evaluate("({edges: window.cwlensGraph.visibleEdges(), kept: document.body.innerText})")
    shot = tmp_path / f"{name}.png"
    page.screenshot(path=str(shot))
    _keep(shot)
    stats = png_stats(shot, step=4)
    page.evaluate("window.cwlensGraph.search('John')")  # zoomed in: labels legible
    page.wait_for_timeout(200)
    zoomed = tmp_path / f"{name}_zoomed.png"
    page.screenshot(path=str(zoomed))
    _keep(zoomed)
    assert log.problems() == []
    return {**info, "stats": stats}


@pytest.mark.parametrize("n", [512, 4096, 8192])
def test_a_long_graph_opens_and_draws(loaded, tmp_path, n):
    """30 layers x n positions, top-k 8, two metrics (synthetic: random edges): the page stays
    under 25 MB, opens without an error and draws; at 8,192 it keeps each node's strongest
    edges that fit and says so."""
    page, log = loaded
    path = synthetic_graph(n_layers=30, n=n, top_k=8).save(tmp_path / f"graph_{n}.html")
    assert path.stat().st_size <= 25e6
    info = _open_long(page, log, path, tmp_path, f"graph_viewer_{n}")
    assert info["edges"] > 0
    assert info["stats"]["colours"] > 20 and info["stats"]["stddev"] > 5, info["stats"]
    assert ("keeps each node's top" in info["kept"]) == (n == 8192)


def test_the_analyze_reports_graph_section(loaded, tmp_path):
    """``cwlens analyze``'s report carries the graph (its own reducers in the report's pass)."""
    from cwlens.report import analyze_text, render_report

    page, log = loaded
    an = analyze_text(tiny_model("llama"), TEXT, model_name="tiny")
    assert an.graph is not None and an.graph.compare.metric == "attention"
    path = render_report(an, tmp_path / "report.html")
    page.goto(path.resolve().as_uri(), wait_until="load")
    page.wait_for_function("window.cwlensGraph && window.cwlensGraph.readyMs > 0")
    assert page.locator("#contribution-graph").is_hidden()  # the report's first tab is the report
    page.click("text=Contribution graph (interactive)")
    page.wait_for_timeout(300)
    assert page.locator("#contribution-graph").is_visible() and page.locator("#tab-report").is_hidden()
    # the viewer, laid out while hidden, fits itself when its tab opens
    assert page.evaluate("window.cwlensGraph.root.querySelector('canvas').clientWidth") > 300
    rows = page.evaluate("window.cwlensGraph.select(2, 9)")
    _same_rows(rows, an.graph.node(2, 9))
    shot = tmp_path / "graph_in_report.png"
    page.screenshot(path=str(shot))
    _keep(shot)
    assert log.problems() == []
