"""The ``cwlens sinks`` command end to end on a tiny model, and the light-import promise."""

import json
import subprocess
import sys

import pytest

from cwlens.cli.main import main
from cwlens.sinks.run import TABLES
from cwlens.testing import save_tiny


def test_sinks_command_writes_tables_figures_and_summary(tmp_path, capsys):
    model_dir = save_tiny("llama", tmp_path)
    out, figs = tmp_path / "run", tmp_path / "figs"
    argv = ["sinks", "--model", str(model_dir), "--samples", "4", "--max-tokens", "24",
            "--batch-size", "2", "--out", str(out), "--figures", str(figs), "--no-png"]
    assert main(argv) == 0
    for name in TABLES.values():
        assert (out / name).exists(), name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_samples"] == 4 and summary["sweep_max_rel_error"] < 1e-4
    stems = {p.stem for p in figs.glob("sinks_*.html")}
    assert stems == {"sinks_rate_vs_contribution", "sinks_factor_split", "sinks_cosines",
                     "sinks_sweep", "sinks_intervention", "sinks_observed"}
    printed = capsys.readouterr().out
    assert "sink summary" in printed and "anti-alignment" in printed
    assert "observed ||o^h|| vs own sink rate" in printed
    assert 0 <= summary["observed_interior_frac_heads"] <= 1
    # --plot-only redraws from the tables without a model
    assert main(["sinks", "--plot-only", "--out", str(out), "--figures", str(figs), "--no-png"]) == 0
    assert "note" not in capsys.readouterr().err
    # another --eps: the stored sink heads were chosen at the run's eps, so the summary
    # keeps it (it printed "mean rate > 0.9: 8 of 8" beside a mean rate of 0.19) and says so
    assert main(["sinks", "--plot-only", "--out", str(out), "--figures", str(figs), "--no-png",
                 "--eps", "0.9", "--samples", "7", "--scales", "3"]) == 0
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    for part in ("--eps 0.3 (asked: 0.9)", "--scales 0,0.5 (asked: 3)", "4 texts (asked: --samples 7)"):
        assert part in err, part
    assert "mean rate > 0.3" in captured.out
    assert json.loads((out / "summary.json").read_text())["eps"] == 0.3
    # --figures "" draws nothing (it drew into the current folder)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    import os

    here = os.getcwd()
    os.chdir(elsewhere)
    try:
        assert main([*argv[:-3], "--figures", "", "--no-png"]) == 0
    finally:
        os.chdir(here)
    assert not list(elsewhere.iterdir())


def test_core_sinks_imports_only_torch():
    code = (
        "import sys, cwlens.core.sinks\n"
        "print(','.join(m for m in ('transformer_lens', 'plotly', 'pandas', 'transformers') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("name, label", [
    ("smollm2-135m", "smollm2-135m (Q4_1 GGUF, dequantized)"),
    ("gemma-3-270m", "gemma-3-270m (Q4_K_M GGUF, dequantized)"),  # crashed: no ".Q4_1." suffix
    ("gpt2", "gpt2"), ("/some/local/dir", "/some/local/dir"),
])
def test_model_label_names_the_quantisation_of_every_offline_model(name, label):
    from cwlens.engine.models.registry import model_label

    assert model_label(name) == label


def test_sinks_without_sink_heads_write_strict_json_and_say_none(tmp_path, capsys):
    """No head above --eps: the means over sink heads are NaN. summary.json held bare NaN
    tokens (not JSON for jq or JavaScript) and the summary printed "sink rate nan"."""
    from cwlens.sinks.summary import read_summary

    out = tmp_path / "run"
    argv = ["sinks", "--model", str(save_tiny("llama", tmp_path)), "--samples", "2",
            "--max-tokens", "12", "--eps", "0.999", "--scales", "0", "--out", str(out),
            "--figures", ""]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "sink heads: none (no head's mean sink rate is above 0.999)" in printed
    assert "sink rate nan" not in printed and "nan vs nan" not in printed

    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")

    raw = json.loads((out / "summary.json").read_text(), parse_constant=refuse)
    assert raw["n_sink_heads"] == 0 and raw["sink_heads_mean_rate"] is None
    back = read_summary(out)
    assert back["sink_heads_mean_rate"] != back["sink_heads_mean_rate"]  # NaN again
    assert back["sink_heads_factors"]["cosine"] != back["sink_heads_factors"]["cosine"]
    assert back["max_tokens"] == 12 and back["n_heads"] == raw["n_heads"]
    # --plot-only finds the same summary (null equals NaN) and leaves the file alone
    before = (out / "summary.json").stat().st_mtime_ns
    assert main(["sinks", "--plot-only", "--out", str(out), "--figures", str(tmp_path / "figs"),
                 "--no-png"]) == 0
    assert (out / "summary.json").stat().st_mtime_ns == before
