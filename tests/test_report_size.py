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
            # (graph_top_k=0: the contribution graph grows with the text, by design: 48.2)
            an = analyze_text(model, text, max_tokens=None, window=16, past_context=True,
                              graph_top_k=0)
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


def test_analyze_refuses_a_max_mb_below_the_fixed_part_and_one_token_of_text(tmp_path, capsys):
    """--max-mb 2 wrote 4.9 MB (plotly.js alone is ~4.8 MB) with rc 0; --max-tokens 1
    analysed <bos> alone; a window longer than the text was "capped" to more tokens than
    the text has."""
    import pytest

    from cwlens.cli.main import main
    from cwlens.errors import InvalidArgumentError
    from cwlens.report.html import fixed_bytes
    from cwlens.testing import save_tiny

    model_dir = str(save_tiny("llama", tmp_path))
    base = ["analyze", "--model", model_dir, "--device", "cpu", "--out", str(tmp_path / "r.html")]
    assert main([*base, "--text", "hello world the cat", "--max-mb", "2"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "--max-mb 2 is below the report's fixed part" in err and "pass --max-mb" in err
    assert not (tmp_path / "r.html").exists()
    assert main([*base, "--text", "hello world the cat", "--max-tokens", "1"]) == 1
    assert "keeps one token" in capsys.readouterr().err
    with pytest.raises(InvalidArgumentError, match="max_tokens=1 keeps one token"):
        analyze_text(tiny_model("llama"), "hello world", max_tokens=1)
    room = fixed_bytes() / 1e6 + 0.001  # fits the fixed part, not a 2-token heatmap
    assert main([*base, "--text", "hello world the cat", "--max-mb", f"{room:.4f}"]) == 1
    assert "leaves no room for the heatmaps" in capsys.readouterr().err
    assert main([*base, "--text", "hello world the cat", "--window", "100000"]) == 0
    assert "drawing the last" not in capsys.readouterr().err  # 5 tokens fit: no cap to speak of


def test_default_layers_reach_the_last_layer_and_the_summary_follows_layers():
    """_spread(2, 4) gave [0] and _spread(3, 4) [0, 1]: a small model's report and summary
    left out its last layers; the printed summary ignored --layers."""
    from cwlens.report.analysis import _spread

    assert _spread(2, 4) == [0, 1] and _spread(3, 4) == [0, 1, 2] and _spread(30, 4) == [0, 10, 19, 29]
    an = analyze_text(tiny_model("llama"), "the cat sat on the mat", window=4)
    lines = an.summary_lines(layers=[1])
    assert any(x.startswith("  layer  1:") for x in lines) and not any(x.startswith("  layer  0:") for x in lines)
