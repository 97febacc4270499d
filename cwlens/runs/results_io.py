"""Results on disk that survive kills and concurrent runs.

Four primitives, used by ``cwlens faithfulness`` and ``cwlens sinks``:

- :func:`results_lock`: one run per results folder. The lock is an ``flock`` on
  ``<folder>/.cwlens.lock``, which the kernel releases when the holder dies (kill -9
  included), so a lock left by a dead run is simply taken over. The file records the
  holder's pid, host, start time and command, and a second run fails at once with a
  :class:`ResultsLockedError` that names them. Re-entrant within one process. In a
  torchrun job, rank 0 holds it for the whole job (the file also records the job's
  master address, run id and size) and the other ranks join it.
- :func:`atomic_write_text` / :func:`atomic_write`: a table is written to a temporary file
  in the same folder, flushed, fsynced and renamed over the target (``os.replace``,
  atomic on POSIX): a reader sees the old file or the new one, never a mix or 0 bytes.
- :func:`append_text`: appends one record (e.g. one sample's rows) with one ``write``,
  then ``flush`` + ``fsync``; readers ignore a torn last line (:func:`complete_lines`).
  A path ending in ``.gz`` gets each record as one gzip member (a multi-member gzip file,
  which ``gzip -d`` and :mod:`gzip` read whole); a member cut by a kill is the torn
  record there. Gzipping a finished plain file (one member) gives a valid one too.
- :func:`clean_stale_temps`: removes the temporary files a killed writer left behind
  (called under the lock, so none of them belongs to a live writer).

Test hook: ``CWLENS_TEST_WRITE_DELAY=<seconds>`` sleeps between writing a temporary file
and renaming it, so that tests can kill a run in the middle of a save.
"""

import errno
import gzip
import json
import os
import socket
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from pathlib import Path

from cwlens.core.env import number
from cwlens.errors import CwlensError
from cwlens.runs import distributed

LOCK_NAME = ".cwlens.lock"
TEMP_PREFIX = ".cwlens-tmp-"


class ResultsLockedError(CwlensError, RuntimeError):
    """Another live run holds the results folder."""


_held: dict[str, list] = {}  # realpath of the folder -> [fd, depth] (re-entrant lock)


def _holder_text(lock_path: Path) -> str:
    try:
        info = json.loads(lock_path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "another process"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    job = info.get("torchrun")
    who = (f"a torchrun job of {job.get('world_size')} processes (master {job.get('master')}, "
           f"run id {job.get('run_id')}), rank 0 = pid {info.get('pid')} on {info.get('host')}"
           if job else f"pid {info.get('pid')} on {info.get('host')}")
    return f"{who} (started {started}: {info.get('command', '?')})"


@contextmanager
def results_lock(folder, what: str | None = None):
    """Hold the results folder for this run (see the module docstring).

    In a torchrun job (:func:`cwlens.runs.distributed.is_distributed`) every rank calls it at
    the same point: rank 0 takes the lock (its file records the job: master address and
    port, run id, number of processes), the other ranks join it, and if rank 0 cannot
    take it every rank raises the same error at once. Each rank checks that it sees rank
    0's lock file (the folder must be shared by all nodes). On a normal exit the ranks
    meet at a barrier before rank 0 lets go, so the lock covers every rank's writes.

    Raises:
        ResultsLockedError: another live process holds it; the message names that
            process and says how to proceed.
    """
    folder = Path(folder)
    key = os.path.realpath(folder)
    if key in _held:  # this process holds it already
        _held[key][1] += 1
        try:
            yield
        finally:
            _held[key][1] -= 1
        return

    if distributed.is_distributed():
        with _job_lock(folder, key, what):
            yield
        return
    with _process_lock(folder, key, what):
        yield


@contextmanager
def _process_lock(folder: Path, key: str, what: str | None, job: dict | None = None):
    folder.mkdir(parents=True, exist_ok=True)
    lock_path = folder / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
        yield None  # a read-only folder: nobody can write results there, so nothing to guard
        return
    try:
        import fcntl  # optional: fcntl is POSIX-only

        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except ImportError:  # no flock (Windows): run unlocked rather than refuse
        pass
    except BlockingIOError:
        os.close(fd)
        raise ResultsLockedError(
            f"{folder} is in use by {_holder_text(lock_path)}. Wait for that run to finish "
            "(rerunning the same command afterwards resumes and computes only what is "
            "missing), or pass another --out."
        ) from None
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
            "command": what or " ".join(sys.argv)}
    if job is not None:
        info["torchrun"] = job
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(info).encode(), 0)
    os.fsync(fd)  # other nodes of a job read it (shared file systems)
    _held[key] = [fd, 1]
    try:
        clean_stale_temps(folder)
        yield info
    finally:
        del _held[key]
        os.close(fd)  # releases the flock; the file stays (unlinking it would race)


@contextmanager
def _job_lock(folder: Path, key: str, what: str | None):
    """:func:`results_lock` for every rank of a torchrun job (rank 0 holds the flock)."""
    w = distributed.world()
    with ExitStack() as stack:
        def acquire():
            info = stack.enter_context(_process_lock(folder, key, what, distributed.job_info()))
            return None if info is None else info["started"]

        stamp = distributed.on_main(acquire)  # rank 0's error, if any, raised on every rank
        ok, message = True, ""
        if not w.main:
            try:
                seen = json.loads((folder / LOCK_NAME).read_text() or "{}").get("started")
            except (OSError, ValueError):
                seen = None
            if stamp is not None and seen != stamp:
                ok, message = False, (
                    f"{folder} is not the folder rank 0 locked: results must go to a folder that "
                    "every node of the job shares (a network file system), given by the same --out.")
            _held[key] = [None, 1]
        finished = False
        try:
            distributed.check_all(ok, message)
            yield
            finished = True
        finally:
            if not w.main:
                del _held[key]
            if finished:
                distributed.barrier()  # every rank's writes are done before rank 0 lets go


def holds_lock(folder) -> bool:
    """Whether this process holds :func:`results_lock` on ``folder``."""
    return os.path.realpath(folder) in _held


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # not supported on every platform
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def plain_file_mode(path: Path | None = None) -> int:
    """The permissions ``open(path, "w")`` would give: the existing file's, else 0o666
    less the umask. ``tempfile.mkstemp`` makes 0o600 files, which a rename would carry over
    to results that a group sharing a cluster folder then cannot read."""
    if path is not None and path.exists():
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def atomic_write(path, write: Callable[[Path], object]) -> Path:
    """Create ``path`` atomically: ``write(tmp)`` fills a temporary file beside it, which
    is fsynced and renamed over ``path`` (with a plain file's permissions, not mkstemp's).
    A symbolic link is followed: its target is replaced, the link stays (a rename over the
    link would have turned it into a plain file and left the page it points to as it was)."""
    path = Path(os.path.realpath(path)) if Path(path).is_symlink() else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{path.name}.", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        os.chmod(tmp, plain_file_mode(path))
        write(tmp)
        with open(tmp, "rb+") as f:
            f.flush()
            os.fsync(f.fileno())
        delay = number("CWLENS_TEST_WRITE_DELAY", 0.0, inclusive=True)
        if delay:
            time.sleep(delay)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def atomic_write_text(path, text: str) -> Path:
    """:func:`atomic_write` of a UTF-8 text."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def is_gzip(path) -> bool:
    """Whether ``path`` is stored gzip-compressed (its name ends in ``.gz``)."""
    return str(path).endswith(".gz")


def _gzip(text: str) -> bytes:
    return gzip.compress(text.encode("utf-8"), mtime=0)  # mtime 0: same text, same bytes


def atomic_write_lines(path, text: str) -> Path:
    """:func:`atomic_write_text`, gzip-compressed (one member) where ``path`` ends in ``.gz``."""
    if is_gzip(path):
        return atomic_write(path, lambda tmp: tmp.write_bytes(_gzip(text)))
    return atomic_write_text(path, text)


def append_text(path, text: str) -> None:
    """Append ``text`` with one write, then flush and fsync (one gzip member where
    ``path`` ends in ``.gz``)."""
    data = _gzip(text) if is_gzip(path) else text.encode("utf-8")
    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class DamagedResultsError(CwlensError, ValueError):
    """A gzip results file that cannot be read to its end for another reason than a cut
    last record (not gzip data, or a damaged member): nothing is cut or recomputed."""


def _member_follows(data: bytes, start: int, tries: int = 64) -> bool:
    """Whether a whole gzip member starts somewhere after ``start`` (the magic bytes alone
    can occur by chance inside compressed data, so each candidate is decoded)."""
    pos = data.find(b"\x1f\x8b\x08", start)
    while pos >= 0 and tries > 0:
        d = zlib.decompressobj(wbits=31)
        try:
            d.decompress(data[pos:])
            if d.eof:  # a whole member: the torn one is not the last
                return True
        except zlib.error:
            pass
        pos, tries = data.find(b"\x1f\x8b\x08", pos + 1), tries - 1
    return False


def _scan_members(data: bytes) -> tuple[list[tuple[int, bytes]], int, bool]:
    """The complete gzip members at the start of ``data`` as ``(start offset, text)``, the
    offset where they end, and whether what follows is damaged (False: nothing follows,
    or a member cut short, as a kill leaves it)."""
    members: list[tuple[int, bytes]] = []
    pos, view = 0, memoryview(data)
    while pos < len(data):
        d = zlib.decompressobj(wbits=31)
        try:
            chunk = d.decompress(view[pos:])
        except zlib.error:
            return members, pos, True
        if not d.eof:  # cut short (a kill), unless another member starts after it
            return members, pos, _member_follows(data, pos + 1)
        members.append((pos, chunk))
        pos = len(data) - len(d.unused_data)
    return members, pos, False


def gzip_members(data: bytes) -> tuple[bytes, int]:
    """The decompressed text of the complete gzip members at the start of ``data`` and
    the offset where they end (``len(data)`` unless the last member is cut or damaged)."""
    if not data:
        return b"", 0
    try:
        return gzip.decompress(data), len(data)
    except (EOFError, OSError, zlib.error):  # a member cut by a kill (or damaged)
        pass
    members, end, _ = _scan_members(data)
    return b"".join(text for _, text in members), end


def _damaged(path: Path, data: bytes, at: int, n_members: int, why: str) -> DamagedResultsError:
    if at == 0 and data.lstrip()[:1] in (b"{", b"["):
        plain = path.with_name(path.name[: -len(".gz")])
        return DamagedResultsError(
            f"{path} is not gzip data: it holds plain JSON lines. Rename it to {plain} "
            "(a plain results file), or compress it with `gzip` to keep the .gz name.")
    return DamagedResultsError(
        f"{path} is damaged at byte {at} of {len(data)} ({why}, after {n_members} readable "
        f"gzip members). Nothing was cut. To keep the rows before it and recompute the rest, "
        f"cut the file there (`truncate -s {at} {path}`) and rerun; or move the file away to "
        "recompute everything.")


def _gzip_lines(path: Path, data: bytes, repair: bool) -> bytes:
    """The complete lines of a gzip results file; a cut last member, or a last member
    whose last line is unterminated (a gzipped interrupted plain file), is the torn
    record, cut off where ``repair``. Anything else unreadable raises
    :class:`DamagedResultsError`."""
    members, end, damaged = _scan_members(data)
    if damaged:
        raise _damaged(path, data, end, len(members), "not a gzip member")
    for k, (_, text) in enumerate(members[:-1]):
        if text and not text.endswith(b"\n"):
            raise _damaged(path, data, members[k + 1][0], k + 1,
                           "the member before it ends inside a line")
    text = b"".join(t for _, t in members)
    whole = text[: text.rfind(b"\n") + 1]
    if repair and (end < len(data) or len(whole) < len(text)):
        cut = members[-1][0] if len(whole) < len(text) else end
        last = members[-1][1] if len(whole) < len(text) else b""
        keep = last[: last.rfind(b"\n") + 1]
        with open(path, "r+b") as f:
            f.truncate(cut)
            if keep:
                f.seek(cut)
                f.write(_gzip(keep.decode("utf-8")))
            f.flush()
            os.fsync(f.fileno())
    return whole


def complete_lines(path, repair: bool = False) -> list[str]:
    """The complete (newline-terminated) lines of ``path``; ``[]`` if it does not exist.
    ``repair=True`` cuts a torn last line (gzip: a cut last member) off the file (only its
    writer may do that). A gzip file that is damaged elsewhere, or is not gzip data,
    raises :class:`DamagedResultsError` and is left as it is."""
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    if is_gzip(path):
        text = _gzip_lines(path, data, repair)
    else:
        end = data.rfind(b"\n") + 1
        text = data[:end]
        if repair and end < len(data):
            with open(path, "r+b") as f:
                f.truncate(end)
                f.flush()
                os.fsync(f.fileno())
    return [ln for ln in text.decode("utf-8").splitlines() if ln.strip()]


def clean_stale_temps(folder) -> list[Path]:
    """Remove temporary files of :func:`atomic_write` left in ``folder`` (and its direct
    subfolders) by a killed run. Call it only while holding :func:`results_lock`."""
    removed = []
    folder = Path(folder)
    for p in [*folder.glob(f"{TEMP_PREFIX}*"), *folder.glob(f"*/{TEMP_PREFIX}*")]:
        if p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed
