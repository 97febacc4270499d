"""``cwlens analyze``: the HTML report opens offline in headless Chromium and is not blank."""

import os
import re

import pytest

from cwlens.cli.main import main
from cwlens.plotting.export import find_chrome
from cwlens.testing import save_tiny

from ._browser import png_stats, screenshot_html

TEXT = "when mary and john went to the store , john gave a bottle of milk to mary ."


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    model_dir = save_tiny("llama", tmp)
    out = tmp / "report.html"
    assert main(["analyze", "--model", str(model_dir), "--text", TEXT, "--out", str(out), "--device", "cpu"]) == 0
    return out


def test_report_is_self_contained(report):
    page = report.read_text(encoding="utf-8")
    assert re.search(r"<script[^>]*\bsrc=", page) is None  # no external script: works offline
    assert page.count("Plotly.newPlot") == 3
    for section in ("Attention sinks", "Token level", "Per head", "Factor split", "Top contributing tokens per query"):
        assert section in page


def test_report_renders_in_headless_chromium(report, tmp_path):
    if find_chrome() is None:
        if os.environ.get("CI"):
            pytest.fail("no Chromium: scripts/setup.sh installs it (apt-get install chromium)")
        pytest.skip("no Chromium installed")
    shot = tmp_path / "shot.png"
    console, errors = screenshot_html(report, shot, width=1400, height=1800)
    assert errors == [], errors
    stats = png_stats(shot)
    assert stats["colours"] > 50 and stats["stddev"] > 5, stats  # heatmaps drawn, not a blank page


def test_blank_page_is_detected(tmp_path):
    """The check above can fail: a page whose plotly.js is missing renders blank."""
    if find_chrome() is None:
        pytest.skip("no Chromium installed")
    page = tmp_path / "blank.html"
    page.write_text("<html><body><div id=p></div><script>Plotly.newPlot('p', [])</script></body></html>")
    shot = tmp_path / "blank.png"
    _, errors = screenshot_html(page, shot)
    assert any("Plotly is not defined" in e for e in errors)
    assert png_stats(shot)["colours"] <= 2


def test_analyze_rejects_bad_input(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:  # checked by argparse, before any model loads
        main(["analyze", "--model", "smollm2-135m", "--file", str(tmp_path / "missing.txt")])
    assert exit_.value.code == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_streamed_analysis_equals_cached_measures(arch):
    """``analyze_text`` streams in query blocks; its window, last-query factors, sink rates,
    top tokens and checks equal the same things computed from a full cache."""
    import torch
    from torch.testing import assert_close

    import cwlens
    from cwlens.report import analyze_text
    from cwlens.testing import tiny_model

    model = tiny_model(arch)
    a = analyze_text(model, TEXT, window=(3, 11), top_k=4, check_intra=True, query_block=5)
    tokens = model.to_tokens(TEXT)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, closure=True)
    parts = cwlens.decompose(cache, model, kind="inter")  # [layer, 1, head, q, k]
    tol = dict(rtol=1e-5, atol=2e-6)
    for f in ("attention", "relative_norm", "cosine", "contribution"):
        full = getattr(parts, f)[:, 0]
        assert_close(getattr(a, f), full[:, :, 3:11, 3:11], **tol)
        assert_close(a.last_query[f], full[:, :, -1, :], **tol)
    assert_close(a.sink_rate, parts.attention[:, 0, :, 1:, 0].mean(-1), **tol)  # after the sink
    tok = parts.contribution[:, 0].sum(1)  # [layer, q, k]
    assert_close(a.sink_token_contribution, tok[:, 1:, 0].mean(-1), **tol)
    want_keys = tok.abs().topk(4, dim=-1).indices
    want = tok.gather(-1, want_keys)
    if arch != "bert":  # a decoder's query i sees keys 0..i: the others are marked -1 / NaN
        seen = want_keys <= torch.arange(want.shape[1])[:, None]
        want, want_keys = want.masked_fill(~seen, float("nan")), want_keys.masked_fill(~seen, -1)
    assert_close(a.top_values, want, equal_nan=True, **tol)
    assert_close(a.top_keys, want_keys)
    assert_close(torch.tensor(a.closure_error), torch.tensor(cwlens.closure(cache, model).relative_error),
                 rtol=0.5, atol=1e-6)
    assert a.sum_error < 1e-5 and a.intra_sum_error < 1e-5


def test_long_text_report_is_capped(tmp_path, capsys):
    """A window that would make the page too large is shrunk, with a note."""
    model_dir = save_tiny("llama", tmp_path)
    out = tmp_path / "r.html"
    text = " ".join([TEXT] * 8)
    assert main(["analyze", "--model", str(model_dir), "--text", text, "--out", str(out),
                 "--device", "cpu", "--window", "500", "--max-mb", "6"]) == 0
    assert "drawing the last" in capsys.readouterr().err
    assert 4e6 < out.stat().st_size < 6e6
