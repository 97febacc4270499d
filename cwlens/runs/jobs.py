"""The job engine: plan -> lock -> agree -> resume -> shard -> progress -> merge.

Every resumable run of cwlens (the faithfulness sweep, the sink analysis, the
replication's encoder stage) is a :class:`Job`: a study says what its plan is, how its
store opens and what is finished in it, how one item is computed and saved, and how the
items merge; :func:`run_job` does the choreography they share:

1. **plan** -- the study fixes its items (batches) from the samples and the
   configuration before anything runs, so a resumed run computes the numbers of an
   uninterrupted one;
2. **lock** -- :func:`cwlens.runs.results_io.results_lock` on the results folder;
3. **agree** -- in a torchrun job every rank checks that all computed the same
   configuration (:func:`cwlens.runs.distributed.agree`);
4. **resume** -- rank 0 opens the store first (``resume=False`` starts it afresh; it
   repairs what a kill left) and tells every rank what is finished; the other ranks then
   open theirs, resuming;
5. **shard** -- the items left are dealt round-robin over the ranks
   (:func:`cwlens.runs.distributed.shard`);
6. **progress** -- one bar on rank 0 that counts every rank's output as it lands (or,
   for a job that :attr:`~Job.ticks`, the units it reports as it goes);
7. **merge** -- after a barrier, the study merges (rank 0 writes, every rank returns).

A job without a folder runs in memory: no lock, no resume, no barriers.
"""

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cwlens.runs import distributed
from cwlens.runs.progress import ticking
from cwlens.runs.results_io import results_lock


@dataclass(frozen=True)
class JobSpec:
    """What the engine needs to know of a run besides its items."""

    what: str  # named when the ranks disagree, e.g. "sweep configuration"
    config: dict  # the run's configuration, agreed by every rank
    folder: Path | None  # locked during the run; None: in memory (no lock, no resume)
    resume: bool  # False: rank 0 starts the store afresh
    total: int  # progress units of the whole run
    desc: str  # the progress bar's label
    unit: str  # "sample" or "batch"
    progress: bool = True


class Job(ABC):
    """A study's resumable, sharded run; :func:`run_job` calls these in order."""

    spec: JobSpec

    @abstractmethod
    def open(self, resume: bool, rank: int | None) -> None:
        """Open this process's store (``rank``: None outside a torchrun job); rank 0
        opens first, with the caller's ``resume``, the other ranks then resume."""

    @abstractmethod
    def survey(self) -> Any:
        """Rank 0, after opening: what is finished or left in the store (picklable)."""

    @abstractmethod
    def adopt(self, view: Any) -> None:
        """Take rank 0's :meth:`survey` (so every rank deals the same items)."""

    @abstractmethod
    def todo(self) -> Sequence[Any]:
        """The items left to compute, in plan order (the same on every rank)."""

    @abstractmethod
    def initial(self) -> int:
        """Progress units already done when the run starts."""

    #: True: :meth:`do` returns 0 and reports its work with
    #: :func:`cwlens.runs.progress.tick` as it goes (e.g. per forward pass), in the units
    #: of :meth:`total` and :meth:`initial`
    ticks: bool = False

    def total(self) -> int:
        """Progress units of the whole run (asked after :meth:`open`; default ``spec.total``)."""
        return self.spec.total

    def counter(self) -> Callable[[], int] | None:
        """Progress units done by every rank so far (None: this rank's own count)."""
        return None

    @abstractmethod
    def do(self, item: Any) -> int:
        """Compute and save one item; return the progress units it finished."""

    @abstractmethod
    def merge(self) -> Any:
        """After every rank's items: merge them (rank 0 writes); the run's result."""


def run_job(job: Job) -> Any:
    """Run ``job`` through plan -> lock -> agree -> resume -> shard -> progress -> merge
    (see the module docstring); return :meth:`Job.merge`."""
    spec = job.spec
    if spec.folder is None:
        job.open(False, None)
        job.adopt(job.survey())
        _work(job)
        return job.merge()
    with results_lock(spec.folder):
        distributed.agree(spec.config, spec.what)
        rank = distributed.world().rank if distributed.is_distributed() else None
        def first() -> Any:
            job.open(spec.resume, rank)
            return job.survey()

        view = distributed.on_main(first)
        if not distributed.world().main:
            job.open(True, rank)
        job.adopt(view)
        distributed.barrier()  # every store repaired before anyone counts what is done
        _work(job)
        distributed.barrier()  # every rank's items are saved
        result = job.merge()
        distributed.barrier()
    return result


def _work(job: Job) -> None:
    spec = job.spec
    todo = job.todo()
    with distributed.JobProgress(job.total(), job.initial(), spec.desc, spec.unit,
                                 enabled=spec.progress, count=job.counter()) as bar, \
            ticking(bar.advance if job.ticks else None):
        for item in distributed.shard(todo):
            bar.advance(job.do(item))
