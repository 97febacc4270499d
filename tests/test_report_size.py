"""``cwlens analyze``'s report does not grow with n²: the heatmaps cover the window only
(capped to fit ``--max-mb``), and the rest grows with the text alone, so a 32k-token text
gives a report of a few MB beyond plotly.js (docs/long_context.md)."""

import warnings

from cwlens.report import analyze_text, render_report
from cwlens.report.html import estimated_bytes, window_for
from cwlens.testing import tiny_model


def test_the_report_grows_with_the_text_only(tmp_path):
    model = tiny_model("llama")  # rotary: runs past its n_ctx of 128 with past_context
    sizes, chars = [], []
    for reps in (25, 400):  # 151 and 2401 tokens
        text = " ".join(["the cat sat on the mat"] * reps)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            an = analyze_text(model, text, max_tokens=None, window=16, past_context=True)
        assert len(an.str_tokens) == 6 * reps + 1
        sizes.append(render_report(an, tmp_path / f"r{reps}.html").stat().st_size)
        chars.append(len(text))
    # only the escaped text itself grows (an n^2 term would add millions of bytes here)
    assert sizes[1] - sizes[0] <= 2 * (chars[1] - chars[0]) + 2000, sizes


def test_the_window_is_capped_so_the_report_fits_max_mb():
    # SmolLM2-135M's shape: 30 layers x 9 heads, 4 layers of per-head heatmaps
    window = window_for(50.0, 30, 9, 4)
    assert 1 <= window and estimated_bytes(30, 9, 4, window) <= 50e6
    assert estimated_bytes(30, 9, 4, window + 1) > 50e6
