"""``cwlens circuits`` in-process on a tiny model."""

import pandas as pd

from cwlens.cli.main import main


def test_circuits_command_on_a_tiny_model(tmp_path, capsys):
    from cwlens.testing import save_tiny

    model_dir = save_tiny("llama", tmp_path)
    out, figs = tmp_path / "runs", tmp_path / "figs"
    argv = ["circuits", "--model", str(model_dir), "--device", "cpu", "--task", "induction",
            "--length", "5", "--prompts", "2", "--top", "3", "--k", "3", "--out", str(out),
            "--figures", str(figs), "--no-png", "--threshold", "0.01"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    for piece in ("top 3 heads by each score", "agreement with patching over 8 heads",
                  "contribution_key", "attention_key", "direct_logit", "patching", "token flow"):
        assert piece in text
    heads = pd.read_csv(out / "induction_heads.csv")
    assert len(heads) == 8 and {"patching", "contribution_share", "attention_key"} <= set(heads.columns)
    agreement = pd.read_csv(out / "induction_agreement.csv")
    assert set(agreement["score"]) == {"contribution_share", "contribution_key", "attention_key", "direct_logit"}
    edges = pd.read_csv(out / "induction_flow_edges.csv")
    assert list(edges.columns) == ["layer", "from_pos", "to_pos", "weight", "from_token", "to_token"]
    assert (edges["weight"].abs() >= 0.01).all() and len(edges) > 0
    for name in ("agreement", "token_flow"):
        assert (figs / f"circuits_induction_{name}.html").stat().st_size > 100_000


def test_circuits_task_that_does_not_tokenize_exits_1(tmp_path, capsys):
    from cwlens.testing import save_tiny

    model_dir = save_tiny("llama", tmp_path)  # word-level lower-case vocabulary: no " Mary"
    assert main(["circuits", "--model", str(model_dir), "--task", "ioi", "--no-png",
                 "--out", str(tmp_path), "--figures", str(tmp_path)]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "single-token answers" in err and "use --task induction" in err  # a flag, not Python


def test_circuits_without_figures_draws_nothing(tmp_path, capsys, monkeypatch):
    """--figures '' drew into the working directory ('' read as '.'); it means none, as in
    faithfulness, sinks and replicate."""
    from cwlens.testing import save_tiny

    model_dir = save_tiny("llama", tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main(["circuits", "--model", str(model_dir), "--device", "cpu", "--task", "induction",
                 "--length", "3", "--prompts", "2", "--k", "3", "--out", "runs", "--figures", "",
                 "--no-png", "--top", "100", "--threshold", "5"]) == 0
    text = capsys.readouterr().out
    # --top past the 8 heads printed 92 empty numbered rows; --threshold 5 kept 0 edges silently
    assert "top 8 heads by each score" in text and "0 flow edges with |weight| >= 5.0 (none: the largest" in text
    assert not list(tmp_path.glob("*.html")) and sorted(p.suffix for p in (tmp_path / "runs").iterdir()) == [".csv"] * 3
