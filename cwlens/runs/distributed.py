"""Data parallelism on ``torch.distributed``: the glue that lets ``torchrun`` split a sweep.

    torchrun --nproc-per-node=4 -m cwlens faithfulness --dataset gsm8k --samples 400
    torchrun --nproc-per-node=4 -m cwlens sinks --dataset gsm8k --samples 400

Without ``torchrun`` (no ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` in the environment, or a
world of one process) every function here is a no-op and cwlens runs as one process.

How a job is split (:func:`shard`): the sweep plans its batches exactly as one process
would (the same samples in the same batches, fixed by the sample list and the
configuration); rank 0 reads the results folder and says which batches still have
unfinished samples; those batches, in plan order, are dealt round-robin: rank ``r`` of
``W`` computes the ``r``-th, ``(r+W)``-th, ... of them. Every sample is therefore computed
in the batch it would be in a one-process run (identical inputs, padding and numbers),
and dealing the length-sorted plan round-robin gives each rank short and long batches
alike. Ranks write their own files (faithfulness: ``<name>.shard-<rank>.jsonl``; sinks:
one ``raw/batch-<k>.json`` per batch), and rank 0 merges after a barrier.

The process group carries only a few small control messages (who holds the folder lock,
which batches are left, the configuration each rank computed, the final counts), all
on the CPU, so it uses the ``gloo`` backend on every device: CUDA ranks never exchange
tensors, and gloo needs no GPU memory and no ``torch.cuda.set_device`` to work.
``CWLENS_DIST_TIMEOUT_S`` (default 7200) bounds how long a rank waits at a barrier.

Devices (:func:`placement`): under torchrun each rank computes on its own device:
``cuda:LOCAL_RANK`` (with ``--device cuda`` or no ``--device`` on a CUDA machine), or the
CPU. With ``n_devices=k`` each model copy is split over ``k`` GPUs: rank ``r`` (local
rank on its node) gets GPUs ``r*k .. r*k+k-1``, so a node with ``G`` GPUs runs
``torchrun --nproc-per-node=G/k``.
"""

import datetime
import os
import pickle
import threading
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from cwlens.core.env import number
from cwlens.engine.device_map import (  # re-exported: the CLI and users import them here
    DEVICE_MAP_STRATEGIES as DEVICE_MAP_STRATEGIES,
)
from cwlens.engine.device_map import (
    PlacementError as PlacementError,
)
from cwlens.engine.device_map import (
    check_device_map as check_device_map,
)
from cwlens.engine.device_map import (
    parse_device_map as parse_device_map,
)
from cwlens.errors import CwlensError
from cwlens.runs.progress import new_bar

T = TypeVar("T")

class DistributedError(CwlensError, RuntimeError):
    """The processes of a torchrun job disagree, or the job is set up wrongly."""


@dataclass(frozen=True)
class World:
    """This process's place in the job (``rank 0 of 1`` without torchrun)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: the process that holds the lock, merges and reports."""
        return self.rank == 0


def launched() -> World | None:
    """The world torchrun describes in the environment, or None without torchrun."""
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return None
    try:
        size = int(env["WORLD_SIZE"])
        return World(int(env["RANK"]), size, int(env["LOCAL_RANK"]),
                     int(env.get("LOCAL_WORLD_SIZE", size)))
    except ValueError:
        raise DistributedError(
            f"RANK={env['RANK']!r}, WORLD_SIZE={env['WORLD_SIZE']!r}, LOCAL_RANK="
            f"{env['LOCAL_RANK']!r} are not integers: start the job with torchrun, which sets them."
        ) from None


def is_distributed() -> bool:
    """A process group of more than one process is initialised (:func:`session`)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world() -> World:
    """This process's :class:`World` (``World()`` outside a distributed job)."""
    if not is_distributed():
        return World()

    env = launched() or World()
    return World(dist.get_rank(), dist.get_world_size(), env.local_rank, env.local_size)


def require_session() -> None:
    """Refuse to run a sweep in a torchrun job whose process group was not started:
    every process would compute the whole sweep and fight over the results folder."""
    env = launched()
    if env is not None and env.size > 1 and not is_distributed():
        raise DistributedError(
            "This process was started by torchrun (WORLD_SIZE="
            f"{env.size}) but the process group is not initialised: wrap the run in "
            "`with cwlens.runs.distributed.session():` (the cwlens command does this)."
        )


TIMEOUT_VAR = "CWLENS_DIST_TIMEOUT_S"


def _timeout() -> datetime.timedelta:
    """``CWLENS_DIST_TIMEOUT_S`` (default 7200): a finite number of seconds above 0."""
    return datetime.timedelta(seconds=number(TIMEOUT_VAR, 7200.0, error=DistributedError))


def check_environment() -> None:
    """Refuse, before any model loads, a torchrun environment that cannot start a process
    group: a missing or malformed ``MASTER_ADDR`` / ``MASTER_PORT``, a rank outside the
    world, a timeout that is not a number. A no-op without torchrun or for one process."""
    env = launched()
    if env is None or env.size <= 1:
        return
    if not 0 <= env.rank < env.size or env.local_rank < 0:
        raise DistributedError(
            f"RANK={env.rank} / LOCAL_RANK={env.local_rank} do not fit WORLD_SIZE={env.size}: "
            "start the job with torchrun, which sets them.")
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k, "").strip()]
    if missing:
        raise DistributedError(
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set, but "
            f"WORLD_SIZE={env.size} asks for a process group: start the job with torchrun "
            "(it sets them), or set MASTER_ADDR=<host of rank 0> and MASTER_PORT=<a free port>.")
    port = os.environ["MASTER_PORT"].strip()
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise DistributedError(f"MASTER_PORT={port!r} is not a port number (1..65535): set it to "
                               "a free port, e.g. MASTER_PORT=29500.")
    _timeout()


@contextmanager
def session():
    """Initialise the process group when started by torchrun with more than one process
    (gloo backend; see the module docstring), and destroy it at the end. Yields the
    :class:`World`. Nested use and use without torchrun are no-ops."""
    env = launched()
    if env is None or env.size <= 1 or is_distributed():
        yield world()
        return

    check_environment()
    timeout = _timeout()
    try:
        dist.init_process_group("gloo", timeout=timeout)
    except Exception as err:  # a peer that never joins: DistStoreError after the timeout
        raise DistributedError(
            f"rank {env.rank} of {env.size}: the process group did not form within "
            f"{timeout.total_seconds():g} s at {os.environ.get('MASTER_ADDR')}:"
            f"{os.environ.get('MASTER_PORT')} ({type(err).__name__}: "
            f"{' '.join(str(err).split())[:160]}). Start every process of the job (same "
            f"MASTER_ADDR/MASTER_PORT, --nnodes/--nproc-per-node adding up to WORLD_SIZE), or "
            f"raise {TIMEOUT_VAR} if some start late.") from None
    try:
        yield world()
    finally:
        dist.destroy_process_group()


def shard(items: Sequence[T]) -> list[T]:
    """This rank's share of ``items``: ``items[rank::world_size]`` (round-robin, in order);
    all of them outside a distributed job."""
    w = world()
    return list(items[w.rank :: w.size])


def barrier() -> None:
    """Wait for every rank (no-op outside a distributed job)."""
    if is_distributed():
        dist.barrier()


def gather(obj: Any) -> list:
    """Every rank's ``obj``, in rank order, on every rank (``[obj]`` outside a job)."""
    if not is_distributed():
        return [obj]

    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _portable(err: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:
        return DistributedError(f"rank 0 failed: {type(err).__name__}: {err}")


def on_main(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 only and return its result on every rank; if it raises, every
    rank raises the same error (so the whole job fails at once, with rank 0's message)."""
    if not is_distributed():
        return fn()

    payload: list = [None]
    error = None
    if dist.get_rank() == 0:
        try:
            payload[0] = ("ok", fn())
        except Exception as e:
            error = e
            payload[0] = ("error", _portable(e))
    dist.broadcast_object_list(payload, src=0)
    kind, value = payload[0]
    if kind == "error":
        if error is not None:
            raise error
        raise value
    return value


def check_all(ok: bool, message: str = "") -> None:
    """Every rank says whether it is fine; if any is not, every rank raises
    :class:`DistributedError` with the first failing rank's message."""
    results = gather((bool(ok), message))
    for rank, (good, msg) in enumerate(results):
        if not good:
            raise DistributedError(f"rank {rank}: {msg}")


def agree(value: Any, what: str) -> None:
    """Refuse (on every rank) a job whose ranks computed different ``value``s, e.g. the
    sweep configuration: their shards could not be merged into one table."""
    values = gather(value)
    bad = [r for r, v in enumerate(values) if v != values[0]]
    if bad:
        diff = ""
        if isinstance(values[0], dict) and isinstance(values[bad[0]], dict):
            a, b = values[0], values[bad[0]]
            diff = " (differs in " + ", ".join(sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))) + ")"
        raise DistributedError(
            f"the ranks of this torchrun job disagree on the {what}: rank {bad[0]} differs from "
            f"rank 0{diff}. Every process must run the same command on the same files "
            "(same model, datasets and options); their shards cannot be merged otherwise."
        )


def job_info() -> dict:
    """What identifies this torchrun job (recorded in the results folder's lock file)."""
    env = os.environ
    w = world()
    return {"world_size": w.size,
            "master": f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}",
            "run_id": env.get("TORCHELASTIC_RUN_ID")}


# -- devices -------------------------------------------------------------------------


def placement(device: str | None = None, n_devices: int | None = None,
              device_map: str | dict | None = None, *, env: World | None = None,
              cuda_count: int | None = None,
              memory: Callable[[int], int] | None = None) -> dict:
    """The ``load_model`` keyword arguments (``device``, ``n_devices``, ``device_map``,
    ``max_memory``) for this process, checked before any model is loaded.

    One process: the arguments as given (checked). Under torchrun (``env``: the world
    torchrun describes; default :func:`launched`) each rank gets its own device:
    ``cuda:LOCAL_RANK`` for ``device`` None (CUDA present) or ``"cuda"``; with
    ``n_devices=k > 1`` the GPUs ``LOCAL_RANK*k .. LOCAL_RANK*k+k-1`` through a
    ``max_memory`` budget on exactly those GPUs (``device_map``: the strategy, default
    ``"balanced"``); one process with ``n_devices=k`` gets GPUs ``0..k-1`` the same way.
    ``cuda_count``: the visible GPUs (default: ``torch.cuda.device_count()``); ``memory(gpu)``:
    the bytes allowed on a GPU (default: its free memory less 10%).

    Raises:
        PlacementError: ``device`` with ``device_map``, ``n_devices < 1``, more GPUs asked
            than visible, a fixed device or an explicit device map shared by every rank.
    """
    if cuda_count is None:
        cuda_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    env = launched() if env is None else env
    check_device_map(device_map, cuda_count)
    ranks = env is not None and env.size > 1
    local_rank = env.local_rank if env is not None else 0
    local_size = env.local_size if env is not None else 1
    if n_devices is not None and n_devices < 1:
        raise PlacementError(f"--n-devices must be at least 1; got {n_devices}.")
    if device_map is not None and device is not None:
        raise PlacementError(
            f"--device {device} and --device-map are exclusive: a device map places the model "
            "itself. Drop --device (or drop --device-map to load on one device).")
    k = n_devices or 1
    if k > 1:
        if device is not None and str(device).split(":")[0] != "cuda":
            raise PlacementError(f"--n-devices {k} splits the model over CUDA GPUs; it cannot "
                                 f"be combined with --device {device}.")
        if device is not None and ":" in str(device):
            raise PlacementError(f"--n-devices {k} picks the GPUs itself; pass --device cuda "
                                 f"(or nothing), not {device}.")
        if isinstance(device_map, dict):
            raise PlacementError("--n-devices and an explicit --device-map are exclusive: the "
                                 "map already says where each module goes. Pass one.")
        needed = k * (local_size if ranks else 1)
        if cuda_count < needed:
            per = f" ({local_size} processes per node x {k})" if ranks else ""
            raise PlacementError(
                f"--n-devices {k} needs {needed} GPUs{per}; this machine has {cuda_count}. "
                + ("Start fewer processes per node (--nproc-per-node=GPUs/n_devices) or lower "
                   "--n-devices." if ranks else "Lower --n-devices."))
    if k > 1:  # one copy over k GPUs: this rank's group (GPUs 0..k-1 for one process)
        first = (local_rank if ranks else 0) * k
        memory = memory or _free_memory
        return {"device": None, "device_map": device_map or "balanced",
                "max_memory": {g: memory(g) for g in range(first, first + k)}}
    if not ranks:
        return {"device": None, "device_map": device_map} if device_map is not None else {"device": device}
    # one copy of the model per rank, on one device
    if isinstance(device_map, dict):
        raise PlacementError(
            "An explicit --device-map under torchrun would put every rank's copy on the same "
            "GPUs. Use --n-devices k (rank r gets GPUs r*k..r*k+k-1), optionally with "
            f"--device-map {'/'.join(DEVICE_MAP_STRATEGIES)}.")
    if device_map is not None:
        raise PlacementError(
            f"--device-map {device_map} under torchrun needs --n-devices k: how many GPUs each "
            "rank's copy of the model spans (rank r gets GPUs r*k..r*k+k-1).")
    kind = None if device is None else str(device).split(":")[0]
    if kind == "cuda" and ":" in str(device):
        raise PlacementError(
            f"--device {device} under torchrun would put every rank on the same GPU; pass "
            "--device cuda (rank r uses cuda:LOCAL_RANK) or no --device.")
    if kind == "cuda" or (device is None and cuda_count > 0):
        if local_rank >= cuda_count:
            raise PlacementError(
                f"local rank {local_rank} has no GPU: this node has {cuda_count} and torchrun "
                f"started {local_size} processes on it. Use --nproc-per-node={cuda_count} or "
                "less, or --device cpu.")
        return {"device": f"cuda:{local_rank}"}
    return {"device": device or "cpu"}


def _free_memory(gpu: int) -> int:
    """Bytes HF's dispatcher may use on ``gpu`` (free memory, less 10% headroom)."""
    free, _ = torch.cuda.mem_get_info(gpu)
    return int(free * 0.9)


# -- one progress bar for the whole job ------------------------------------------------


class JobProgress:
    """One progress bar for the whole job, on rank 0 only (on stderr, where
    :func:`cwlens.runs.progress.shown`: a terminal, or ``CWLENS_PROGRESS=1``).

    One process: :meth:`advance` moves the bar by this process's finished work. In a
    distributed job rank 0's bar shows ``count()``, the job-wide number of finished
    units that the caller reads from the results on disk (so it counts every rank's work,
    exactly as it lands), polled every ``interval`` seconds in a thread; other ranks
    show nothing.
    """

    def __init__(self, total: int, initial: int, desc: str, unit: str, enabled: bool = True,
                 count: Callable[[], int] | None = None, interval: float = 1.0):
        self.bar = None
        self.count = count if is_distributed() else None
        self._stop = threading.Event()
        self._thread = None
        if enabled and world().main:
            self.bar = new_bar(total, desc, unit, initial=initial)  # None: not drawn here
            if self.bar is not None and self.count is not None:
                self._thread = threading.Thread(target=self._poll, args=(interval,), daemon=True)
                self._thread.start()

    def _poll(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self._show()

    def _show(self) -> None:
        if self.bar is not None and self.count is not None:
            n = min(self.count(), self.bar.total)
            if n != self.bar.n:
                self.bar.n = n
                self.bar.refresh()

    def advance(self, k: int = 1) -> None:
        if self.bar is None:
            return
        if self.count is None:
            self.bar.update(k)
        else:
            self._show()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._show()
        if self.bar is not None:
            self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
