"""Compressed results (``<name>.jsonl.gz``, one gzip member per sample): the same table,
resume, torn-write repair, shards and CLI as the plain ``.jsonl`` store."""

import gzip
import json
import os
import signal
import time

import pandas as pd
import pytest

from cwlens.errors import InvalidArgumentError
from cwlens.faithfulness import read_results
from cwlens.faithfulness.results import ResultsWriter, RowCounter, merge_shards
from cwlens.runs.results_io import DamagedResultsError, complete_lines, gzip_members
from cwlens.testing import save_tiny
from tests.test_faithfulness_resume import rows, run_here, start_script, table


def _ids(path) -> set[str]:
    return {json.loads(x)["sample_id"] for x in complete_lines(path)}


def test_gzip_store_holds_the_plain_lines_and_repairs_a_cut_member(tmp_path):
    plain, packed = tmp_path / "p" / "d.jsonl", tmp_path / "z" / "d.jsonl.gz"
    for path in (plain, packed):
        w = ResultsWriter(path, {"a": 1}, rows_per_sample=3)
        counter = RowCounter(path)
        w.write_sample(rows("s0"))
        w.write_sample(rows("s1"))
        assert counter.new_rows() == 6
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()  # `gzip -d` reads it whole
    assert (packed.parent / "d.config.json").read_text() == (plain.parent / "d.config.json").read_text()
    assert packed.stat().st_size < plain.stat().st_size
    whole = packed.read_bytes()
    member = gzip.compress(("".join(json.dumps(r) + "\n" for r in rows("s2"))).encode(), mtime=0)
    with open(packed, "ab") as f:  # a kill in the middle of writing s2's member
        f.write(member[: len(member) // 2])
    assert gzip_members(packed.read_bytes()) == (gzip.decompress(whole), len(whole))
    assert len(read_results(packed)) == 6 and _ids(packed) == {"s0", "s1"}  # the cut member is ignored
    w = ResultsWriter(packed, {"a": 1}, rows_per_sample=3)  # resume: the writer repairs its file
    assert w.done == {"s0", "s1"} and packed.read_bytes() == whole
    w.write_sample(rows("s2"))
    assert len(read_results(packed)) == 9
    pd.testing.assert_frame_equal(read_results(packed).iloc[:6], read_results(plain))


def test_gzipping_a_plain_file_resumes_it(tmp_path):
    """``gzip x.jsonl`` (one member holding every line, and a torn last line a kill left)
    is a store that resumes: the complete samples count, the torn one is recomputed."""
    plain = tmp_path / "d.jsonl"
    w = ResultsWriter(plain, {"a": 1}, rows_per_sample=3)
    w.write_sample(rows("s0"))
    with open(plain, "a") as f:
        f.write(json.dumps(rows("s1")[0]) + "\n" + '{"model": "m", "da')
    packed = tmp_path / "d.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    w = ResultsWriter(packed, {"a": 1}, rows_per_sample=3)
    assert w.done == {"s0"}
    w.write_sample(rows("s1"))
    t = read_results(packed)
    assert len(t) == 6 and sorted(t.sample_id.unique()) == ["s0", "s1"]


def _two_samples(path):
    w = ResultsWriter(path, {"a": 1}, rows_per_sample=3)
    w.write_sample(rows("s0"))
    w.write_sample(rows("s1"))
    return path.read_bytes()


def test_damage_before_the_last_member_raises_and_leaves_the_file(tmp_path):
    """Only a cut last member is a kill's torn write; a damaged earlier member is not cut
    away (that would drop good rows after it): the error names the byte and the fix."""
    packed = tmp_path / "d.jsonl.gz"
    whole = _two_samples(packed)
    first = len(gzip.compress(("".join(json.dumps(r) + "\n" for r in rows("s0"))).encode(), mtime=0))
    broken = bytearray(whole)
    broken[first // 2] ^= 0xFF  # a flipped byte inside the first member
    packed.write_bytes(bytes(broken))
    for read in (lambda: read_results(packed),
                 lambda: ResultsWriter(packed, {"a": 1}, rows_per_sample=3)):
        with pytest.raises(DamagedResultsError, match=r"damaged at byte 0 .*truncate -s 0"):
            read()
        assert packed.read_bytes() == bytes(broken)


def test_text_appended_to_a_gzip_store_raises(tmp_path):
    packed = tmp_path / "d.jsonl.gz"
    whole = _two_samples(packed)
    packed.write_bytes(whole + b'{"model": "m"}\n')  # `echo ... >> d.jsonl.gz`
    with pytest.raises(DamagedResultsError, match=f"damaged at byte {len(whole)} .*2 readable"):
        ResultsWriter(packed, {"a": 1}, rows_per_sample=3)
    assert packed.read_bytes().startswith(whole)


def test_plain_lines_under_a_gz_name_raise_naming_the_rename(tmp_path):
    plain = tmp_path / "d.jsonl"
    _two_samples(plain)
    packed = tmp_path / "d.jsonl.gz"
    plain.rename(packed)
    with pytest.raises(DamagedResultsError, match=r"not gzip data.*Rename it to .*d\.jsonl\b"):
        read_results(packed)


def test_a_cut_member_holding_the_gzip_magic_by_chance_is_still_a_cut_member(tmp_path):
    """The three magic bytes inside a torn member's compressed data are not a new member."""
    packed = tmp_path / "d.jsonl.gz"
    whole = _two_samples(packed)
    stored = gzip.compress(b'{"x": "\x1f\x8b\x08\x00 ..."}\n' * 50, compresslevel=0, mtime=0)
    assert stored.find(b"\x1f\x8b\x08", 10) > 0  # a stored block keeps the bytes as they are
    packed.write_bytes(whole + stored[:-30])  # a kill in the middle of writing it
    w = ResultsWriter(packed, {"a": 1}, rows_per_sample=3)
    assert w.done == {"s0", "s1"} and packed.read_bytes() == whole


def test_gzip_shards_merge_into_one_file(tmp_path):
    path = tmp_path / "d.jsonl.gz"
    ResultsWriter(path, {"c": 1}, rows_per_sample=3, shard="0").write_sample(rows("s0"))
    b = ResultsWriter(path, {"c": 1}, rows_per_sample=3, shard="1")
    b.write_sample(rows("s1"))
    b.write_sample(rows("s0"))  # computed twice: counts once
    assert sorted(p.name for p in tmp_path.glob("d.*.gz")) == ["d.shard-0.jsonl.gz", "d.shard-1.jsonl.gz"]
    assert ResultsWriter(path, {"c": 1}, rows_per_sample=3, shard="2").done == {"s0", "s1"}
    merge_shards(path, 3, order=["s1", "s0"])
    assert [p.name for p in tmp_path.glob("d*.gz")] == ["d.jsonl.gz"]
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    assert [json.loads(x)["sample_id"] for x in lines] == ["s1"] * 3 + ["s0"] * 3


def test_sigkilled_gzip_run_resumes_to_the_plain_runs_table(tmp_path):
    save_tiny("llama", tmp_path)
    killed = tmp_path / "runs" / "gsm8k.jsonl.gz"
    proc = start_script(tmp_path, killed, delay=0.3)
    deadline = time.time() + 120
    while time.time() < deadline:  # kill once some, not all, samples are on disk
        if killed.exists() and len(_ids(killed)) >= 2:
            break
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 2 <= len(_ids(killed)) < 8
    run_here(tmp_path, killed)
    full = tmp_path / "full" / "gsm8k.jsonl"
    run_here(tmp_path, full)
    a, b = table(killed), table(full)
    assert a.sample_id.nunique() == 8
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert killed.stat().st_size * 4 < full.stat().st_size


def test_cli_compress_writes_gz_and_a_gz_folder_resumes_without_the_flag(tmp_path, capsys):
    from cwlens.cli.faithfulness_request import _results_path
    from cwlens.cli.main import main

    assert _results_path(tmp_path, "gsm8k", compress=False) == tmp_path / "gsm8k.jsonl"
    assert _results_path(tmp_path, "gsm8k", compress=True) == tmp_path / "gsm8k.jsonl.gz"
    w = ResultsWriter(tmp_path / "gsm8k.jsonl.gz", {}, rows_per_sample=1)
    for sid, v in (("a", 1.0), ("b", 3.0)):
        w.write_sample([{**rows(sid, 1)[0], "dataset": "gsm8k", "measure": "delta_ppl", "value": v}])
    assert _results_path(tmp_path, "gsm8k", compress=False) == tmp_path / "gsm8k.jsonl.gz"
    assert main(["faithfulness", "--dataset", "gsm8k", "--out", str(tmp_path), "--report-only",
                 "--figures", ""]) == 0
    (tmp_path / "gsm8k.jsonl").write_text("")
    with pytest.raises(InvalidArgumentError, match="holds both gsm8k.jsonl and gsm8k.jsonl.gz"):
        _results_path(tmp_path, "gsm8k", compress=False)
    (tmp_path / "gsm8k.jsonl.gz").unlink()
    with pytest.raises(InvalidArgumentError, match="compress it first"):
        _results_path(tmp_path, "gsm8k", compress=True)
    # --no-resume starts afresh in either format: the writer deletes the other one too
    assert _results_path(tmp_path, "gsm8k", compress=True, fresh=True) == tmp_path / "gsm8k.jsonl.gz"
    (tmp_path / "gsm8k.jsonl").write_text(json.dumps(rows("old", 1)[0]) + "\n")
    w = ResultsWriter(tmp_path / "gsm8k.jsonl.gz", {}, rows_per_sample=1, resume=False)
    assert w.done == set() and not (tmp_path / "gsm8k.jsonl").exists()
    w.write_sample([{**rows("a", 1)[0], "dataset": "gsm8k", "measure": "delta_ppl", "value": 1.0}])
    (tmp_path / "gsm8k.jsonl.gz").rename(tmp_path / "keep.gz")
    (tmp_path / "gsm8k.jsonl").write_text("")
    assert main(["faithfulness", "--dataset", "ioi", "--out", str(tmp_path), "--report-only",
                 "--figures", ""]) != 0
    assert "holds results of gsm8k" in capsys.readouterr().err
