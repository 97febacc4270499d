"""``cwlens analyze``'s report in a real browser (headless Chromium, network cut; #41.4, #41.5):
no console error, every plot drawn, each slider changes the heatmap it drives, the colour
range button switches every head to one range, and masked cells are grey, not a zero's colour."""

import pytest

from cwlens.cli.main import main
from cwlens.testing import save_tiny

from ._browser import browser_page, open_file, png_stats, read_png

TEXT = "when mary and john went to the store , john gave a bottle of milk to mary ."
GREY = (0xB8, 0xB8, 0xB8)  # cwlens.plotting.heatmaps.MASKED_COLOUR


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser-report")
    out = tmp / "report.html"
    assert main(["analyze", "--model", str(save_tiny("llama", tmp)), "--text", TEXT,
                 "--out", str(out), "--device", "cpu"]) == 0
    return out


@pytest.fixture(scope="module")
def loaded(report):
    """One browser and one load of the report for the module (plotly's 5 MB parse is most of
    a test's time); the tests run in order on the same page."""
    with browser_page(1600, 1200) as (page, log):
        open_file(page, report, settle_ms=1500)
        yield page, log


def _state(page, i: int) -> dict:
    """Plot ``i``: its traces, the visible ones, the heatmap images and lines drawn."""
    return page.evaluate("""(i) => {
        const gd = document.querySelectorAll('.js-plotly-plot')[i];
        return {traces: gd.data.length,
                visible: gd.data.map((t, j) => t.visible === false ? -1 : j).filter(j => j >= 0),
                images: Array.from(gd.querySelectorAll('g.hm image')).filter(im =>
                    (im.getAttribute('href') || im.getAttribute('xlink:href') || '').length > 100).length,
                lines: Array.from(gd.querySelectorAll('path.js-line')).filter(p =>
                    (p.getAttribute('d') || '').length > 10).length,
                zmax: gd.data.filter((t, j) => j % 2 == 1).map(t => t.zmax)};
    }""", i)


def _pixel(path, fx: float, fy: float) -> tuple[int, ...]:
    w, h, ch, rows = read_png(path)
    x, y = min(w - 1, int(fx * w)), min(h - 1, int(fy * h))
    return tuple(rows[y][x * ch : x * ch + 3])


def test_every_plot_is_drawn_without_a_console_error(loaded, tmp_path):
    page, log = loaded
    plots = page.locator(".js-plotly-plot")
    assert plots.count() == 3
    sinks, tokens, heads = (_state(page, i) for i in range(3))
    for k in range(2):  # the token-level and the per-head figures
        shot = tmp_path / f"plot{k}.png"
        plots.nth(k + 1).screenshot(path=str(shot))
        stats = png_stats(shot, step=4)
        assert stats["colours"] > 30 and stats["stddev"] > 5, stats
    assert log.problems() == []
    assert sinks["lines"] == 2  # attention and contribution of the first token, per layer
    for plot in (tokens, heads):  # the first step's attention | contribution pair
        assert plot["visible"] == [0, 1] and plot["images"] == 2, plot


@pytest.mark.parametrize("plot", [1, 2], ids=["token level", "per head"])
def test_a_slider_changes_the_heatmap_it_drives(loaded, tmp_path, plot):
    page, log = loaded
    gd = page.locator(".js-plotly-plot").nth(plot)
    gd.scroll_into_view_if_needed()
    before = _state(page, plot)
    gd.screenshot(path=str(tmp_path / "before.png"))
    rail = gd.locator(".slider-rail-touch-rect").bounding_box()
    page.mouse.click(rail["x"] + rail["width"] - 2, rail["y"] + rail["height"] / 2)  # last step
    page.wait_for_timeout(600)
    after = _state(page, plot)
    gd.screenshot(path=str(tmp_path / "after.png"))
    last = after["traces"] - 2
    assert before["visible"] == [0, 1] and after["visible"] == [last, last + 1], (before, after)
    assert after["images"] == 2
    assert read_png(tmp_path / "before.png")[3] != read_png(tmp_path / "after.png")[3]  # redrawn
    # the buttons: one colour range for every step, then each step's own again
    own = after["zmax"]
    assert len(set(own)) > 1  # each head / layer has its own range
    gd.locator(".updatemenu-button").nth(1).click()
    page.wait_for_timeout(300)
    shared = _state(page, plot)["zmax"]
    assert shared == [max(own)] * len(own)
    gd.locator(".updatemenu-button").nth(0).click()
    page.wait_for_timeout(300)
    assert _state(page, plot)["zmax"] == own
    assert log.problems() == []


def test_masked_cells_are_grey_and_zeros_are_not(loaded, tmp_path):
    """Query 0 sees key 0 alone: the top right cell of each heatmap is masked (grey); the
    bottom left one (last query, first key) is a weight, drawn in the colour scale."""
    page, log = loaded
    gd = page.locator(".js-plotly-plot").nth(2)
    gd.scroll_into_view_if_needed()
    for k in range(2):  # attention, contribution
        image = gd.locator("g.hm image").nth(k)
        shot = tmp_path / f"hm{k}.png"
        page.screenshot(path=str(shot), clip=image.bounding_box())
        assert _pixel(shot, 0.97, 0.02) == GREY, k
        assert _pixel(shot, 0.02, 0.98) != GREY, k
    assert log.problems() == []
