"""``cwlens sinks`` under faults: each batch is saved as it finishes, kill -9 at random
points (inside a batch save and inside the final table save) and a rerun give tables
byte-identical to an uninterrupted run; a second run on the folder fails fast; and
``--plot-only`` on a partial or corrupt folder is a clear error, not a traceback."""

import os
import random
import signal
import subprocess
import sys
import time

from cwlens.cli.main import main
from cwlens.sinks.run import MANIFEST, RAW_DIR, TABLES
from cwlens.testing import save_tiny

SCRIPT = "import sys; from cwlens.cli.main import main; sys.exit(main(sys.argv[1:]))"


def argv(model_dir, out, figs):
    return ["sinks", "--model", str(model_dir), "--samples", "6", "--max-tokens", "20",
            "--batch-size", "2", "--out", str(out), "--figures", str(figs), "--no-png"]


def start(args, delay):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore",
           "CWLENS_TEST_WRITE_DELAY": str(delay)}
    return subprocess.Popen([sys.executable, "-c", SCRIPT, *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_for(predicate, proc, timeout=180):
    deadline = time.time() + timeout
    while not predicate() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert predicate(), "the run ended before the moment to kill it"


def kill(proc):
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_kill_at_random_points_and_during_the_save_then_rerun_equals_one_run(tmp_path, capsys):
    model = save_tiny("llama", tmp_path)
    out, figs = tmp_path / "killed", tmp_path / "figs"
    args = argv(model, out, figs)
    raw = out / RAW_DIR
    rng = random.Random(0)
    # 1) somewhere after the first saved batch (each save sleeps 0.5 s before its rename)
    proc = start(args, 0.5)
    wait_for(lambda: (raw / "batch-00000.json").exists(), proc)
    time.sleep(rng.uniform(0.0, 0.4))
    kill(proc)
    saved = sorted(p.name for p in raw.glob("batch-*.json"))
    assert 1 <= len(saved) < 3
    # 2) inside the save of the derived tables: some written, the rest not
    proc = start(args, 1.0)
    wait_for(lambda: list(out.glob(".cwlens-tmp-sink_heads.csv*")), proc)
    # while it holds the folder, a second run fails at once, naming it
    t = time.perf_counter()
    assert main(args) == 1
    assert time.perf_counter() - t < 5
    assert f"in use by pid {proc.pid}" in capsys.readouterr().err
    kill(proc)
    assert (out / TABLES["stats"]).exists() and not (out / MANIFEST).exists()
    # --plot-only refuses the half-written folder with a one-line reason
    assert main(["sinks", "--plot-only", "--out", str(out), "--figures", str(figs), "--no-png"]) == 1
    err = capsys.readouterr().err
    assert "unfinished sinks run" in err and "Rerun" in err and "Traceback" not in err
    # 3) the rerun finishes (no batch is recomputed) and equals an uninterrupted run
    mtimes = {p.name: p.stat().st_mtime_ns for p in raw.glob("batch-*.json")}
    assert main(args) == 0
    assert {p.name: p.stat().st_mtime_ns for p in raw.glob("batch-*.json")} == mtimes
    assert not list(out.rglob(".cwlens-tmp-*"))
    full = tmp_path / "full"
    assert main(argv(model, full, figs)) == 0
    for name in TABLES.values():
        assert (out / name).read_bytes() == (full / name).read_bytes(), name
    assert main(["sinks", "--plot-only", "--out", str(out), "--figures", str(figs), "--no-png"]) == 0


def test_plot_only_on_a_corrupt_or_missing_folder_is_a_clear_error(tmp_path, capsys):
    old = tmp_path / "old"  # tables as an older version wrote them, one cut to 0 bytes
    old.mkdir()
    for name in TABLES.values():
        (old / name).write_text("layer,head\n0,0\n")
    (old / TABLES["heads"]).write_text("")
    base = ["sinks", "--plot-only", "--figures", str(tmp_path / "f"), "--no-png", "--out"]
    assert main([*base, str(old)]) == 1
    err = capsys.readouterr().err
    assert "sink_heads.csv is empty or corrupt" in err and "Traceback" not in err
    assert main([*base, str(tmp_path / "nothing")]) == 1
    assert "no results folder" in capsys.readouterr().err
    assert not (tmp_path / "nothing").exists()


def test_a_resume_with_another_dataset_says_which_texts_differ(tmp_path):
    """Changing --dataset read "differs in samples" only; the message now says which."""
    import pytest

    from cwlens.sinks.store import RawStore, SinkResultsError

    RawStore(tmp_path, {"samples": ["gsm8k-0000", "gsm8k-0001"], "eps": 0.3})
    with pytest.raises(SinkResultsError, match=r"differs in samples: the stored run has 2 texts "
                       r"of gsm8k, this one 3 texts of fineweb_edu"):
        RawStore(tmp_path, {"samples": ["fineweb_edu-0000", "fineweb_edu-0001", "fineweb_edu-0002"],
                            "eps": 0.3})
