"""A saved CircuitsVis view opens offline in a real browser and draws its heads (#41.3).

``circuitsvis``' own ``str(view)`` imports the widget from a CDN: saved to a file and opened
without network it was a blank page. ``cwlens.report.export.circuitsvis_heads`` inlines the
bundle the wheel ships, in ``str(view)``, in the notebook rendering and in ``view.save``."""

import re

import pytest

import cwlens
from cwlens.report.export import circuitsvis_heads
from cwlens.testing import tiny_model

from ._browser import browser_page, open_file, png_stats

TEXT = "when mary and john went to the store , john gave a drink to"


@pytest.fixture(scope="module")
def view_and_heads():
    pytest.importorskip("circuitsvis")
    model = tiny_model("llama")
    tokens = model.to_tokens(TEXT)
    c = cwlens.stream(model, tokens, lambda layer, w: w.clone(), layers=[1])[0][0]  # [head, q, k]
    return circuitsvis_heads(c, model.to_str_tokens(tokens[0]), signed=False), c.shape[0]


def _drawn_heads(page, path, n_heads, tmp_path):
    open_file(page, path, settle_ms=1500)
    text = page.inner_text("body")
    heads = sorted({int(h) for h in re.findall(r"Head (\d+)", text)})
    canvases = page.locator("canvas").count()
    shot = tmp_path / f"{path.stem}.png"
    page.screenshot(path=str(shot))
    return heads, canvases, png_stats(shot)


def test_a_view_saved_as_str_renders_its_heads_offline(view_and_heads, tmp_path):
    """What a user writes to a file (``str(view)``) draws every head with no network."""
    view, n_heads = view_and_heads
    path = tmp_path / "view.html"
    path.write_text(f'<html><head><meta charset="utf-8"></head><body>{view}</body></html>',
                    encoding="utf-8")
    with browser_page() as (page, log):
        heads, canvases, stats = _drawn_heads(page, path, n_heads, tmp_path)
    assert log.problems() == []
    assert heads == list(range(n_heads)), heads  # the head selector lists every head
    assert canvases >= n_heads + 1  # one thumbnail per head and the zoomed head
    assert stats["colours"] > 20 and stats["stddev"] > 5, stats


def test_view_save_writes_a_page_that_opens_from_disk(view_and_heads, tmp_path):
    view, n_heads = view_and_heads
    path = view.save(tmp_path / "sub" / "heads.html")
    page_html = path.read_text(encoding="utf-8")
    assert "unpkg.com" not in page_html and not re.search(r"<script[^>]*\bsrc=", page_html)
    assert "unpkg.com" not in view._repr_html_()  # the notebook rendering is the inlined one too
    with browser_page() as (page, log):
        heads, canvases, _ = _drawn_heads(page, path, n_heads, tmp_path)
    assert log.problems() == [] and heads == list(range(n_heads)) and canvases >= n_heads + 1


def test_save_refuses_a_folder(view_and_heads, tmp_path):
    from cwlens.errors import InvalidArgumentError

    view, _ = view_and_heads
    with pytest.raises(InvalidArgumentError, match="is a folder; pass the path of the .html file"):
        view.save(tmp_path)
