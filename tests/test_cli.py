"""The command line: help texts, exit codes, and the demo on a tiny model."""

import subprocess
import sys

import pytest

from cwlens.cli.main import SUBCOMMANDS, main


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert name in out


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_help(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    # every command takes a model, except groundtruth: its models are compiled RASP programs
    assert ("--program" if name == "groundtruth" else "--model") in out


def test_no_subcommand_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "usage: cwlens" in capsys.readouterr().out


def test_unknown_model_exits_1_with_a_clear_message():
    proc = subprocess.run(
        [sys.executable, "-m", "cwlens", "demo", "--model", "no-such-model", "--no-png"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 1
    assert "cwlens: error: Unknown model 'no-such-model'" in proc.stderr
    assert "smollm2-135m" in proc.stderr


def test_demo_on_a_tiny_model(tmp_path, capsys):
    from cwlens.report.demo import run_demo
    from cwlens.testing import tiny_model

    result = run_demo(model=tiny_model("llama"), model_name="tiny-llama", out_dir=tmp_path, png=False, n_heads=2)
    out = capsys.readouterr().out
    assert "top attended" in out and "top contributing" in out and "factor split" in out
    assert (tmp_path / "demo_attention_vs_contribution.html").stat().st_size > 100_000
    assert len(result["heads"]) == 2
    assert max(result["closure_error"]) < 1e-5


def test_figures_runs_the_steps_it_is_given(tmp_path, capsys):
    from cwlens.testing import save_tiny

    model_dir = save_tiny("llama", tmp_path)
    out = tmp_path / "figs"
    assert main(["figures", "--model", str(model_dir), "--device", "cpu", "--only", "demo", "--out", str(out), "--no-png"]) == 0
    assert "[1/1] cwlens demo" in capsys.readouterr().out
    assert (out / "demo_attention_vs_contribution.html").exists()
    with pytest.raises(SystemExit) as exit_:  # unknown step: a usage error, exit 2
        main(["figures", "--only", "plots"])
    assert exit_.value.code == 2
    assert "unknown step 'plots'" in capsys.readouterr().err


def test_faithfulness_command_on_a_tiny_model(tmp_path, capsys):
    from cwlens.testing import save_tiny

    model_dir = save_tiny("llama", tmp_path)
    out = tmp_path / "runs"
    argv = ["faithfulness", "--model", str(model_dir), "--device", "cpu", "--dataset", "gsm8k",
            "--samples", "2", "--max-tokens", "16", "--rates", "0.5", "--metrics", "attention,contribution",
            "--out", str(out), "--figures", str(tmp_path / "figs"), "--no-png", "--no-progress"]
    assert main(argv) == 0
    assert (out / "gsm8k.jsonl").stat().st_size > 0
    assert (tmp_path / "figs" / "faithfulness_gsm8k.html").exists()
    assert "contrib" in capsys.readouterr().out


def test_figures_redraws_existing_sink_tables(tmp_path, monkeypatch):
    import cwlens.cli.main as cli

    calls = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "main", lambda argv: calls.append(argv) or 0)
    from cwlens.cli.figures import run

    args = cli.build_parser().parse_args(["figures", "--only", "sinks"])
    run(args)
    assert "--plot-only" not in calls[-1]  # no tables yet: compute them
    (tmp_path / "runs" / "sinks").mkdir(parents=True)
    (tmp_path / "runs" / "sinks" / "summary.json").write_text("{}")
    run(args)
    assert "--plot-only" in calls[-1]  # tables exist: only redraw
    run(cli.build_parser().parse_args(["figures", "--only", "sinks", "--rerun"]))
    assert "--plot-only" not in calls[-1]
