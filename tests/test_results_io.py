"""The results-folder primitives: the lock (fails fast naming the holder, taken over from a
dead process, re-entrant), atomic writes (a kill mid-save leaves the old file, and the
temporary file is cleaned), torn-line handling, and the paired bootstrap."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from cwlens.core.bootstrap import paired_bootstrap
from cwlens.errors import CwlensError
from cwlens.runs.results_io import (
    LOCK_NAME,
    TEMP_PREFIX,
    ResultsLockedError,
    atomic_write_text,
    complete_lines,
    holds_lock,
    results_lock,
)

HOLDER = textwrap.dedent("""
    import sys, time
    from cwlens.runs.results_io import results_lock, atomic_write_text
    with results_lock(sys.argv[1], what="holder-test"):
        print("locked", flush=True)
        if sys.argv[2] == "write":
            atomic_write_text(sys.argv[1] + "/table.csv", "new\\n")
        time.sleep(60)
""")


def start_holder(folder, mode="sleep", env=None):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), mode], stdout=subprocess.PIPE,
                            env={**os.environ, **(env or {})}, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_second_run_fails_fast_naming_the_first_and_a_dead_holder_is_taken_over(tmp_path):
    proc = start_holder(tmp_path)
    try:
        t = time.perf_counter()
        with pytest.raises(ResultsLockedError) as err, results_lock(tmp_path):
            pass
        # fails at once rather than waiting out the holder's 60 s (a loose bound: not a timing)
        assert time.perf_counter() - t < 20.0
        msg = str(err.value)
        assert f"pid {proc.pid}" in msg and "holder-test" in msg and "started" in msg
        assert "resumes" in msg and "--out" in msg and isinstance(err.value, CwlensError)
    finally:
        proc.kill()
        proc.wait()
    # the lock file still names the dead process; it is taken over
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == proc.pid
    with results_lock(tmp_path):
        assert holds_lock(tmp_path)
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
        with results_lock(tmp_path):  # re-entrant in one process
            pass
        assert holds_lock(tmp_path)
    assert not holds_lock(tmp_path)


def test_kill_during_an_atomic_write_keeps_the_old_file_and_cleans_the_temp(tmp_path):
    (tmp_path / "table.csv").write_text("old\n")
    proc = start_holder(tmp_path, "write", env={"CWLENS_TEST_WRITE_DELAY": "30"})
    deadline = time.time() + 30

    def written():  # the temp file exists at once (mkstemp), its text a moment later
        temps = list(tmp_path.glob(f"{TEMP_PREFIX}table.csv*"))
        return bool(temps) and temps[0].read_text() == "new\n"

    while not written() and time.time() < deadline:
        time.sleep(0.05)
    assert written()  # written, not yet renamed
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (tmp_path / "table.csv").read_text() == "old\n"
    with results_lock(tmp_path):  # the next run cleans the leftover
        assert not list(tmp_path.glob(f"{TEMP_PREFIX}*"))
        atomic_write_text(tmp_path / "table.csv", "new\n")
    assert (tmp_path / "table.csv").read_text() == "new\n"


def test_atomic_writes_get_a_plain_files_permissions_not_mkstemps(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")  # what open() gives under this umask (0o644 under 022)
    new = atomic_write_text(tmp_path / "config.json", "{}")
    assert new.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
    os.chmod(new, 0o640)  # a file the user restricted keeps its mode when rewritten
    atomic_write_text(new, "{ }")
    assert new.stat().st_mode & 0o777 == 0o640


def test_complete_lines_ignores_and_repairs_a_torn_line(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n{"a": 2}\n{"a"')
    assert complete_lines(p) == ['{"a": 1}', '{"a": 2}']
    assert p.read_text().endswith('{"a"')
    complete_lines(p, repair=True)
    assert p.read_text() == '{"a": 1}\n{"a": 2}\n'
    assert complete_lines(tmp_path / "missing.jsonl") == []


def test_paired_bootstrap_resolves_paired_shifts_and_not_noise():
    rng = np.random.default_rng(1)
    base = rng.normal(0, 10, 40)  # samples differ a lot from each other
    # a small but consistent shift: unpaired intervals overlap, the paired one excludes 0
    shifted = base + 1.0 + rng.normal(0, 0.3, 40)
    d = paired_bootstrap(base, shifted)
    assert d.sign == 1 and d.low > 0 and d.n == 40
    # means differ, but the per-sample differences are noise around it: unresolved
    noisy = base + rng.normal(0, 5, 40)
    d = paired_bootstrap(base, noisy)
    assert d.mean != 0 and d.low < 0 < d.high and d.sign == 0
    same = paired_bootstrap(base, base)
    assert same.identical and same.sign == 0
    assert paired_bootstrap(base, shifted, seed=0) == paired_bootstrap(base, shifted, seed=0)
    with pytest.raises(ValueError):
        paired_bootstrap([1, 2], [1, 2, 3])


def test_an_atomic_write_through_a_symlink_replaces_the_target_and_keeps_the_link(tmp_path):
    """--summary-md / --docs given a link to a page turned the link into a plain file and
    left the page as it was (the rename replaced the link)."""
    from cwlens.faithfulness.report import write_block

    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text("# page\n")
    link = tmp_path / "link.md"
    link.symlink_to(page)
    write_block(link, "| a | b |")
    assert link.is_symlink() and "| a | b |" in page.read_text()
    dangling = tmp_path / "dangling.md"
    dangling.symlink_to(tmp_path / "docs" / "new.md")
    atomic_write_text(dangling, "x")
    assert dangling.is_symlink() and (tmp_path / "docs" / "new.md").read_text() == "x"
