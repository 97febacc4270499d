"""Progress on every long step (#41.2): bars count the unit of work (forward passes, heads
patched, items, texts) as it is done, show the time left, go to stderr, and are drawn
only on a terminal (``CWLENS_PROGRESS=1`` forces them here, where pytest's stderr is
not one) and never with ``--no-progress``."""

import re

import pytest

from cwlens.cli.main import main
from cwlens.runs import progress
from cwlens.testing import save_tiny


@pytest.fixture
def terminal(monkeypatch):
    """Bars drawn on every update, as on a terminal that is watched closely."""
    monkeypatch.setenv(progress.ENV, "1")
    monkeypatch.setattr(progress, "MIN_INTERVAL", 0.0)
    monkeypatch.setattr(progress, "MIN_ITERS", 1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(save_tiny("llama", tmp_path_factory.mktemp("progress")))


def counts(stderr: str, desc: str) -> list[tuple[int, int]]:
    """Every ``k/N`` a bar labelled ``desc`` drew, in order (tqdm redraws with ``\\r``)."""
    found = re.findall(re.escape(desc) + r"[^\r\n]*?\|\s*(\d+)/(\d+) ", stderr)
    return [(int(k), int(n)) for k, n in found]


def test_shown_follows_the_environment_and_the_flag(monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    assert not progress.shown()  # pytest's stderr is no terminal
    monkeypatch.setenv(progress.ENV, "1")
    assert progress.shown() and not progress.shown(enabled=False)
    monkeypatch.setenv(progress.ENV, "0")
    assert not progress.shown()


def test_ticks_reach_the_innermost_ticking_bar(monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    progress.tick(5)  # no bar: nothing happens
    with progress.bar(10, "outer", "x", ticks=True) as outer:
        progress.tick(2)
        with progress.bar(3, "inner", "y", ticks=True) as inner:
            progress.tick()
        with progress.bar(3, "plain", "z") as plain:  # not ticking: the outer bar counts
            progress.tick()
        with progress.ticking(None):  # a step whose ticks nobody counts
            progress.tick(100)
    assert (outer.n, inner.n, plain.n) == (3, 1, 0)


def test_faithfulness_counts_forward_passes(terminal, model_dir, tmp_path, capsys):
    """Two samples in one batch: the bar moves pass by pass (it sat at 0/2 samples, then
    jumped), up to 1 clean + one per distinct mask, with the time left."""
    argv = ["faithfulness", "--model", model_dir, "--device", "cpu", "--samples", "2",
            "--max-tokens", "12", "--rates", "0.5", "--metrics", "attention,contribution",
            "--out", str(tmp_path / "f"), "--figures", ""]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    seen = counts(err, "gsm8k")
    # 2 metrics x 2 modes at one rate: 4 masks, + the clean pass; one batch
    assert seen[0] == (0, 5) and seen[-1] == (5, 5), err
    ks = [k for k, _ in seen]
    assert ks == sorted(ks) and set(ks) == set(range(6)), seen  # one pass at a time
    assert re.search(r"5/5 \[\d\d:\d\d<\d\d:\d\d", err)  # elapsed < time left
    assert "5/5" not in out  # stdout holds the results only
    assert "5 forward passes" in out  # the same count the run reports
    # a rerun resumes: everything is done, the bar starts full
    assert main(argv) == 0
    assert counts(capsys.readouterr().err, "gsm8k")[0] == (5, 5)


def test_no_progress_draws_nothing(terminal, model_dir, tmp_path, capsys):
    argv = ["faithfulness", "--model", model_dir, "--device", "cpu", "--samples", "1",
            "--max-tokens", "12", "--rates", "0.5", "--metrics", "attention", "--out",
            str(tmp_path / "f"), "--figures", "", "--no-progress"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "gsm8k" not in err and "loading" not in err, err


def test_circuits_counts_forward_passes(terminal, model_dir, tmp_path, capsys):
    argv = ["circuits", "--model", model_dir, "--device", "cpu", "--task", "induction",
            "--prompts", "2", "--length", "3", "--k", "3", "--out", str(tmp_path / "c"),
            "--figures", ""]
    assert main(argv) == 0
    err = capsys.readouterr().err
    # counted in sequences run (so that the time left follows the work): clean + corrupted
    # (head scores), the corrupted z and the clean metric, 2 prompts each, then one pass
    # per layer (2) patching its 4 heads: the 2 prompts 4 times
    seen = counts(err, "induction: forward passes")
    ks = [k for k, _ in seen]
    assert ks == sorted(ks) and set(ks) == {0, 2, 4, 6, 8, 16, 24} and seen[-1] == (24, 24), err
    assert f"loading {model_dir}" in err and "token flow" in err


def test_accuracy_and_export_count_items_and_texts(terminal, model_dir, tmp_path, capsys):
    assert main(["accuracy", "--model", model_dir, "--device", "cpu", "--dataset", "ioi",
                 "--samples", "6", "--batch-tokens", "40"]) == 0
    seen = counts(capsys.readouterr().err, "ioi: clean accuracy")
    assert seen[-1] == (6, 6) and len(seen) > 2, seen  # several batches, each counted
    assert main(["export", "--model", model_dir, "--device", "cpu", "--text", "a b c",
                 "--text", "the cat sat", "--text", "x y", "--max-tokens", "8", "--out",
                 str(tmp_path / "e")]) == 0
    assert sorted({k for k, _ in counts(capsys.readouterr().err, "texts exported")}) == [0, 1, 2, 3]


def test_sinks_counts_forward_passes(terminal, model_dir, tmp_path, capsys):
    """Per batch: the streamed analysis, then the intervention's clean pass and one pass
    per scale for the sink and for the random control (4 with one scale); 2 batches."""
    from cwlens.sinks.config import SinkConfig
    from cwlens.sinks.run import passes_per_batch

    assert passes_per_batch(SinkConfig(scales=(0.0,))) == 4
    assert passes_per_batch(SinkConfig(intervention=False)) == 1
    argv = ["sinks", "--model", model_dir, "--device", "cpu", "--samples", "4", "--max-tokens",
            "12", "--batch-size", "2", "--scales", "0", "--out", str(tmp_path / "s"),
            "--figures", ""]
    assert main(argv) == 0
    ks = [k for k, n in counts(capsys.readouterr().err, "sinks") if n == 8]
    assert ks == sorted(ks) and set(ks) == set(range(9)), ks


def test_analyze_counts_layers(terminal, model_dir, tmp_path, capsys):
    """One streamed pass: the bar counts its layers (a 30k-token text takes minutes each)."""
    assert main(["analyze", "--model", model_dir, "--device", "cpu", "--text",
                 "the cat sat on the mat", "--out", str(tmp_path / "r.html")]) == 0
    ks = [k for k, n in counts(capsys.readouterr().err, "streaming") if n == 2]
    assert ks == sorted(ks) and set(ks) == {0, 1, 2}, ks
