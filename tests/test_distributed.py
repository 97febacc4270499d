"""Data-parallel sweeps on torch.distributed (torchrun, CPU, gloo, 2-3 processes).

- ``torchrun --nproc-per-node=2 -m cwlens faithfulness`` / ``sinks`` write files
  byte-identical to a one-process run (the same batches, the same numbers);
- a rank killed with kill -9 loses nothing already written, and a rerun with another
  number of processes computes only the missing batches and ends with the same files;
- the glue (:mod:`cwlens.runs.distributed`): round-robin shards, rank 0's errors raised on
  every rank, ranks that disagree refused, the job-wide folder lock;
- device placement (``--n-devices``, ``--device-map``): bad combinations are clear errors
  before any model loads (no GPU here: the GPU paths are checked as arguments only).

Every process runs one thread (torchrun's default; the reference run sets it too), so
float results are comparable bit for bit.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from cwlens.cli.main import main
from cwlens.faithfulness import read_results
from cwlens.runs import distributed
from cwlens.runs.distributed import PlacementError, World, parse_device_map, placement
from cwlens.sinks.run import RAW_DIR, TABLES
from cwlens.testing import save_tiny

FAITH = ["faithfulness", "--samples", "12", "--max-tokens", "16", "--batch-tokens", "16",
         "--metrics", "attention,contribution,random", "--rates", "0.1,0.3,0.5",
         "--figures", "", "--no-progress"]
SINKS = ["sinks", "--samples", "8", "--max-tokens", "16", "--batch-size", "1", "--no-png"]


def env() -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}


def torchrun(nproc: int, *args, **kw) -> subprocess.Popen:
    """``torchrun --standalone --nproc-per-node=nproc`` (rendezvous on a free local port)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", *args]
    return subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def finish(proc: subprocess.Popen, timeout: float = 600) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def one_process(*args) -> str:
    """``python -m cwlens ...`` without torchrun, one thread; its stdout."""
    run = subprocess.run([sys.executable, "-m", "cwlens", *args], env=env(), capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return save_tiny("llama", tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def reference(tiny, tmp_path_factory) -> Path:
    """The one-process runs every split run is compared with."""
    base = tmp_path_factory.mktemp("reference")
    one_process(*FAITH, "--model", str(tiny), "--out", str(base / "faith"))
    one_process(*SINKS, "--model", str(tiny), "--out", str(base / "sinks"),
                "--figures", str(base / "figs"))
    return base


def same_sink_tables(a: Path, b: Path) -> None:
    for name in [*TABLES.values(), "summary.json"]:
        if (a / name).exists():
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


def rank_pid(launcher: int, rank: int, timeout: float = 120) -> int:
    """The pid of torchrun worker ``rank`` (a child of the launcher with RANK=<rank>)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == launcher and f"RANK={rank}".encode() in (d / "environ").read_bytes().split(b"\0"):
                    return int(d.name)
            except (OSError, IndexError, ValueError):
                continue
        time.sleep(0.05)
    raise AssertionError(f"no worker with RANK={rank}")


def rows_per_sample(path: Path) -> dict[str, int]:
    if not path.exists():
        return {}
    per: dict[str, int] = {}
    for line in path.read_text().splitlines():
        if line.endswith("}"):
            sid = json.loads(line)["sample_id"]
            per[sid] = per.get(sid, 0) + 1
    return per


def samples_in(path: Path, full: int) -> set[str]:
    """The samples with all ``full`` rows in ``path``: a kill can land between two rows of
    one sample, and the rerun does such a sample again."""
    return {s for s, n in rows_per_sample(path).items() if n == full}


# -- equality with one process ------------------------------------------------------


def test_faithfulness_on_two_processes_writes_the_one_process_file(tiny, reference, tmp_path):
    code, out, err = finish(torchrun(2, "-m", "cwlens", *FAITH, "--model", str(tiny),
                                     "--out", str(tmp_path)))
    assert code == 0, err[-3000:]
    assert "over 2 processes" in out and out.count("forward passes in") == 1  # rank 0 reports
    ref = reference / "faith" / "gsm8k.jsonl"
    assert (tmp_path / "gsm8k.jsonl").read_bytes() == ref.read_bytes()  # merged, same order
    assert not list(tmp_path.glob("*.shard-*"))
    a, b = read_results(tmp_path / "gsm8k.jsonl"), read_results(ref)
    assert a.sample_id.nunique() == 12 and a.equals(b)


def test_sinks_on_two_processes_write_the_one_process_tables(tiny, reference, tmp_path):
    code, out, err = finish(torchrun(2, "-m", "cwlens", *SINKS, "--model", str(tiny),
                                     "--out", str(tmp_path / "out"), "--figures", str(tmp_path / "f")))
    assert code == 0, err[-3000:]
    assert out.count("sink summary") == 1
    same_sink_tables(reference / "sinks", tmp_path / "out")


# -- kill -9, then a rerun with another number of processes ----------------------------


def test_faithfulness_rank_killed_then_three_processes_finish_the_same_file(tiny, reference, tmp_path):
    proc = torchrun(2, "-m", "cwlens", *FAITH, "--model", str(tiny), "--out", str(tmp_path))
    ref = reference / "faith" / "gsm8k.jsonl"
    full = max(rows_per_sample(ref).values())
    shard1 = tmp_path / "gsm8k.shard-rank00001.jsonl"
    victim = rank_pid(proc.pid, 1)
    deadline = time.time() + 300
    while not samples_in(shard1, full) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.kill(victim, signal.SIGKILL)  # kill -9 of rank 1 once it has appended a whole sample
    written = samples_in(shard1, full)
    code, _, _ = finish(proc)
    assert code != 0 and written
    before = read_results(tmp_path / "gsm8k.jsonl")
    assert written <= set(before.sample_id)  # nothing appended was lost
    counts = before.groupby("sample_id").size()
    left = 12 - int((counts == full).sum())  # a sample cut between two rows is done again
    assert left > 0, "the job ended before the kill"
    # a different configuration is refused, naming the difference
    assert main([*FAITH, "--model", str(tiny), "--out", str(tmp_path), "--rates", "0.2"]) == 1
    code, out, err = finish(torchrun(3, "-m", "cwlens", *FAITH, "--model", str(tiny),
                                     "--out", str(tmp_path)))
    assert code == 0, err[-3000:]
    assert f"in {left} batches over 3 processes" in out  # one sample per batch here
    assert (tmp_path / "gsm8k.jsonl").read_bytes() == ref.read_bytes()


def test_sinks_rank_killed_then_one_process_finishes_the_same_tables(tiny, reference, tmp_path):
    out_dir = tmp_path / "out"
    proc = torchrun(2, "-m", "cwlens", *SINKS, "--model", str(tiny), "--out", str(out_dir),
                    "--figures", str(tmp_path / "f"))
    victim = rank_pid(proc.pid, 1)
    first = out_dir / RAW_DIR / "batch-00001.json"  # rank 1's first batch (round-robin)
    deadline = time.time() + 300
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.kill(victim, signal.SIGKILL)
    code, _, _ = finish(proc)
    assert code != 0
    saved = {p.name: p.stat().st_mtime_ns for p in (out_dir / RAW_DIR).glob("batch-*.json")}
    assert "batch-00001.json" in saved and len(saved) < 8
    out = one_process(*SINKS, "--model", str(tiny), "--out", str(out_dir),
                      "--figures", str(tmp_path / "f"))
    assert "sink summary" in out
    for name, mtime in saved.items():  # saved batches were kept, not recomputed
        assert (out_dir / RAW_DIR / name).stat().st_mtime_ns == mtime
    same_sink_tables(reference / "sinks", out_dir)


# -- the glue, under torchrun ---------------------------------------------------------

PROBE = textwrap.dedent("""
    import json, os, sys
    from cwlens.runs import distributed as d
    from cwlens.runs.results_io import LOCK_NAME, ResultsLockedError, holds_lock, results_lock

    held, free = sys.argv[1], sys.argv[2]
    out = {}
    def capture(name, fn):
        try:
            out[name] = ["ok", fn()]
        except Exception as e:
            out[name] = [type(e).__name__, str(e)]

    def fail():
        raise ValueError("rank 0 says no")

    def locked():
        with results_lock(free):
            info = json.load(open(os.path.join(free, LOCK_NAME)))
            return [holds_lock(free), info.get("torchrun", {}).get("world_size")]

    def busy():
        with results_lock(held):
            return "entered"

    with d.session() as w:
        out["world"] = [w.rank, w.size, w.main]
        out["shard"] = d.shard(list(range(7)))
        capture("on_main", lambda: d.on_main(lambda: os.getpid()))
        capture("on_main_error", lambda: d.on_main(fail))
        capture("agree_same", lambda: d.agree({"rates": [0.1]}, "sweep configuration"))
        capture("agree_differ", lambda: d.agree({"rates": [w.rank]}, "sweep configuration"))
        capture("check_all", lambda: d.check_all(w.rank == 0, "no GPU"))
        capture("lock", locked)
        capture("busy", busy)
        d.barrier()
    capture("no_session", d.require_session)
    # one file per rank: two ranks printing at once can interleave on a shared stdout
    with open(held + f".probe-{os.environ['RANK']}.json", "w") as f:
        f.write(json.dumps(out))
""")


def test_glue_under_torchrun(tmp_path):
    from cwlens.runs.results_io import results_lock

    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    held, free = tmp_path / "held", tmp_path / "free"
    with results_lock(held):  # this process holds one folder
        code, out, err = finish(torchrun(2, str(script), str(held), str(free)))
    assert code == 0, err[-3000:]
    ranks = [json.loads((tmp_path / f"held.probe-{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [[0, 2, True], [1, 2, False]]
    assert ranks[0]["shard"] == [0, 2, 4, 6] and ranks[1]["shard"] == [1, 3, 5]
    assert ranks[0]["on_main"] == ranks[1]["on_main"]  # rank 0's pid on both
    for r in ranks:
        assert r["on_main_error"] == ["ValueError", "rank 0 says no"]
        assert r["agree_same"] == ["ok", None]
        kind, message = r["agree_differ"]
        assert kind == "DistributedError" and "rank 1 differs from rank 0 (differs in rates)" in message
        assert r["check_all"] == ["DistributedError", "rank 1: no GPU"]
        assert r["lock"] == ["ok", [True, 2]]  # every rank holds it; the file names the job
        kind, message = r["busy"]
        assert kind == "ResultsLockedError" and f"pid {os.getpid()}" in message
        assert r["no_session"][0] == "DistributedError" and "session()" in r["no_session"][1]


def test_a_folder_held_by_a_torchrun_job_is_named_as_such(tmp_path):
    from cwlens.runs.results_io import LOCK_NAME, _holder_text

    (tmp_path / LOCK_NAME).write_text(json.dumps({
        "pid": 12, "host": "node1", "started": 0, "command": "cwlens faithfulness",
        "torchrun": {"world_size": 16, "master": "node1:29500", "run_id": "job7"}}))
    text = _holder_text(tmp_path / LOCK_NAME)
    assert "torchrun job of 16 processes (master node1:29500, run id job7)" in text


# -- without torchrun nothing changes --------------------------------------------------


def test_without_torchrun_everything_is_one_process(monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert distributed.launched() is None and not distributed.is_distributed()
    assert distributed.world() == World() and distributed.shard([1, 2, 3]) == [1, 2, 3]
    assert distributed.on_main(lambda: 5) == 5
    with distributed.session() as w:
        assert w == World() and not distributed.is_distributed()
    distributed.require_session()  # no error


# -- devices: argument handling (no GPU needed) ------------------------------------------

TWO = World(rank=1, size=4, local_rank=1, local_size=2)  # rank 1 of 4, 2 per node


def mem(gpu):
    return 1000 + gpu


@pytest.mark.parametrize("kwargs, expected", [
    ({}, {"device": None}),
    ({"device": "cpu"}, {"device": "cpu"}),
    ({"device_map": "auto"}, {"device": None, "device_map": "auto"}),
    ({"n_devices": 2, "cuda_count": 2}, {"device": None, "device_map": "balanced",
                                          "max_memory": {0: 1000, 1: 1001}}),
    ({"n_devices": 2, "device_map": "sequential", "cuda_count": 4},
     {"device": None, "device_map": "sequential", "max_memory": {0: 1000, 1: 1001}}),
    ({"env": TWO, "cuda_count": 2}, {"device": "cuda:1"}),
    ({"env": TWO, "device": "cuda", "cuda_count": 2}, {"device": "cuda:1"}),
    ({"env": TWO, "cuda_count": 0}, {"device": "cpu"}),
    ({"env": TWO, "device": "cpu", "cuda_count": 2}, {"device": "cpu"}),
    ({"env": TWO, "n_devices": 4, "cuda_count": 8},  # local rank 1 of a 4-GPU group: 4..7
     {"device": None, "device_map": "balanced", "max_memory": {4: 1004, 5: 1005, 6: 1006, 7: 1007}}),
])
def test_placement(kwargs, expected):
    kwargs = {"env": World(), "cuda_count": 0, "memory": mem, **kwargs}
    assert placement(**kwargs) == expected


@pytest.mark.parametrize("kwargs, words", [
    ({"device": "cuda", "device_map": "auto"}, "exclusive"),
    ({"n_devices": 0}, "at least 1"),
    ({"n_devices": 2, "cuda_count": 1}, "needs 2 GPUs; this machine has 1"),
    ({"n_devices": 2, "device": "cpu", "cuda_count": 2}, "CUDA GPUs"),
    ({"n_devices": 2, "device": "cuda:1", "cuda_count": 2}, "picks the GPUs itself"),
    ({"n_devices": 2, "device_map": {"model": 0}, "cuda_count": 2}, "exclusive"),
    ({"env": TWO, "n_devices": 4, "cuda_count": 4}, "needs 8 GPUs (2 processes per node x 4)"),
    ({"env": TWO, "device": "cuda:0", "cuda_count": 2}, "same GPU"),
    ({"env": TWO, "device_map": {"model": 0}, "cuda_count": 2}, "same"),
    ({"env": TWO, "device_map": "auto", "cuda_count": 2}, "needs --n-devices"),
    ({"env": TWO, "device": "cuda", "cuda_count": 1}, "local rank 1 has no GPU"),
])
def test_placement_refuses_combinations_that_cannot_work(kwargs, words):
    kwargs = {"env": World(), "cuda_count": 0, "memory": mem, **kwargs}
    with pytest.raises(PlacementError, match=None) as e:
        placement(**kwargs)
    assert words in str(e.value)


def test_device_map_parsing(tmp_path):
    assert parse_device_map("balanced") == "balanced"
    assert parse_device_map('{"model.embed_tokens": 0, "lm_head": 1}') == {"model.embed_tokens": 0, "lm_head": 1}
    f = tmp_path / "map.json"
    f.write_text('{"model": 0}')
    assert parse_device_map(str(f)) == {"model": 0}
    for bad in ("everywhere", "{not json", "[1, 2]"):
        with pytest.raises(PlacementError):
            parse_device_map(bad)


def test_load_model_checks_placement_before_loading(tmp_path):
    from cwlens import load_model

    missing = str(tmp_path / "no-such-model")  # never reached: the checks come first
    with pytest.raises(PlacementError, match="exclusive"):
        load_model(missing, device="cpu", device_map="auto")
    with pytest.raises(PlacementError, match="at least 1"):
        load_model(missing, n_devices=0)
    if torch.cuda.device_count() < 64:
        with pytest.raises(PlacementError, match="needs 64 CUDA GPUs"):
            load_model(missing, n_devices=64)
    with pytest.raises(PlacementError, match="TransformerBridge"):
        load_model(str(save_tiny("llama", tmp_path)), device_map={"": "cpu"}, generation="hooked")


@pytest.mark.parametrize("command", ["faithfulness", "sinks"])
@pytest.mark.parametrize("flags, code, words", [
    (["--device-map", "everywhere"], 2, "none of auto"),
    (["--n-devices", "0"], 2, "at least 1"),
    (["--n-devices", "two"], 2, "whole number"),
    (["--device", "cpu", "--device-map", "auto"], 1, "exclusive"),
    (["--n-devices", "64"], 1, "needs 64 GPUs"),
])
def test_cli_placement_errors_are_one_line(command, flags, code, words, capsys, tmp_path):
    try:
        got = main([command, "--out", str(tmp_path / "o"), *flags])
    except SystemExit as e:  # argparse usage errors
        got = e.code
    err = capsys.readouterr().err
    assert got == code and words in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()  # refused before anything was written


@pytest.mark.parametrize("command", ["faithfulness", "sinks"])
def test_help_says_how_to_run_on_many_processes(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    assert f"torchrun --nproc-per-node=8 -m cwlens {command}" in text and "--n-devices" in text


# -- SmolLM2 (slow: the real model, a few short samples) ---------------------------------


@pytest.mark.slow
def test_smollm2_two_processes_equal_one(tmp_path):
    """The real model under torchrun writes the one-process file byte for byte (the sink
    analysis under torchrun is checked on the tiny models above: same code path)."""
    faith = ["faithfulness", "--model", "smollm2-135m", "--samples", "3", "--max-tokens", "32",
             "--metrics", "attention,contribution", "--rates", "0.3", "--batch-tokens", "32",
             "--figures", "", "--no-progress", "--device", "cpu"]
    one_process(*faith, "--out", str(tmp_path / "f1"))
    code, _, err = finish(torchrun(2, "-m", "cwlens", *faith, "--out", str(tmp_path / "f2")))
    assert code == 0, err[-3000:]
    assert (tmp_path / "f2" / "gsm8k.jsonl").read_bytes() == (tmp_path / "f1" / "gsm8k.jsonl").read_bytes()


# -- shard files: merge and progress (no processes needed) ------------------------------


def _rows(sample, n=3):
    from cwlens.faithfulness.results import COLUMNS

    return [{**{c: None for c in COLUMNS}, "sample_id": sample, "measure": f"m{k}", "value": k}
            for k in range(n)]


def test_merge_shards_keeps_complete_samples_once_in_one_process_order(tmp_path):
    from cwlens.faithfulness.results import ResultsWriter, merge_shards, shard_name

    path = tmp_path / "r.jsonl"
    a = ResultsWriter(path, {"x": 1}, 3, shard=shard_name(0))
    b = ResultsWriter(path, {"x": 1}, 3, shard=shard_name(1))
    a.write_sample(_rows("s2"))
    b.write_sample(_rows("s1"))
    b.write_sample(_rows("s2"))  # a duplicate (identical rows)
    with open(b.path, "a") as f:  # a write cut by kill -9: two of three rows, then a torn line
        f.write("".join(json.dumps(r) + "\n" for r in _rows("s3")[:2]) + '{"torn')
    c = ResultsWriter(path, {"x": 1}, 3, shard=shard_name(2))  # resume sees every shard
    assert c.done == {"s1", "s2"}
    merge_shards(path, 3, order=["s1", "s2", "s3"])
    assert not list(tmp_path.glob("*.shard-*"))
    ids = [json.loads(x)["sample_id"] for x in path.read_text().splitlines()]
    assert ids == ["s1"] * 3 + ["s2"] * 3  # s3 was cut: recomputed by the next run
    assert merge_shards(path, 3) == path and len(path.read_text().splitlines()) == 6  # no-op


def test_row_counter_counts_only_new_complete_rows(tmp_path):
    from cwlens.faithfulness.results import ResultsWriter, RowCounter, shard_name

    path = tmp_path / "r.jsonl"
    ResultsWriter(path, {"x": 1}, 3).write_sample(_rows("old"))
    counter = RowCounter(path)
    assert counter.new_rows() == 0
    ResultsWriter(path, {"x": 1}, 3, shard=shard_name(1)).write_sample(_rows("new"))
    with open(path, "a") as f:
        f.write('{"half')
    assert counter.new_rows() == 3
