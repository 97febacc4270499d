"""A :class:`~cwlens.runs.jobs.Job` whose store is a faithfulness results file: per-sample
rows appended by :class:`~cwlens.faithfulness.results.ResultsWriter` (a torchrun rank
appends to its own shard; the shards are merged at the end, in plan order), or, without
a folder, rows kept in memory and gathered from every rank."""

from pathlib import Path

from cwlens.faithfulness.results import (
    COLUMNS,
    ConfigMismatchError,
    ResultsWriter,
    RowCounter,
    merge_shards,
    shard_name,
)
from cwlens.runs import distributed
from cwlens.runs.jobs import Job, JobSpec


class MemoryWriter:
    """:class:`ResultsWriter`'s interface, in memory (a run without ``out``)."""

    def __init__(self, rows_per_sample: int):
        self.rows: list[dict] = []
        self.done: set[str] = set()
        self.rows_per_sample = rows_per_sample

    def write_sample(self, rows: list[dict]) -> None:
        self.rows += rows
        self.done.add(rows[0]["sample_id"])


class RowsJob(Job):
    """The store half of a job writing results rows; subclasses plan and compute.

    ``order``: every sample id in the order a one-process run writes them (the merged
    file and the in-memory table follow it)."""

    def __init__(self, spec: JobSpec, out, rows_per_sample: int, order: list[str]):
        self.spec, self.out, self.rows_per_sample, self.order = spec, out, rows_per_sample, order

    def open(self, resume, rank):
        self.writer: ResultsWriter | MemoryWriter
        if self.spec.folder is None:
            self.writer = MemoryWriter(self.rows_per_sample)
        else:
            shard = None if rank is None else shard_name(rank)
            self.writer = ResultsWriter(self.out, self.spec.config, self.rows_per_sample, resume,
                                        shard=shard, only_metrics=self.only_metrics())
            foreign = sorted(self.writer.done - set(self.order))
            if foreign:
                raise ConfigMismatchError(
                    f"{self.out} holds results of {len(foreign)} sample(s) this run does not "
                    f"have ({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}): "
                    "another text (--file: its content changed) or another version of the "
                    "dataset. Use another --out, or --no-resume to start it afresh.")

    def only_metrics(self):
        """The metrics this run adds to a finished one (None: a whole run); see
        :mod:`cwlens.faithfulness.added_metrics`."""
        return None

    def survey(self):
        return sorted(self.writer.done)

    def adopt(self, view):
        self.writer.done = set(view)

    def initial(self):
        return len(self.writer.done & set(self.order))

    def counter(self):
        """Samples finished by every rank: rows landed in the file and its shards."""
        if not isinstance(self.writer, ResultsWriter):
            return None

        counter, initial, per = RowCounter(self.writer.main), self.initial(), self.rows_per_sample
        return lambda: initial + counter.new_rows() // per

    def merge(self):
        """File: rank 0 folds the shards into the file (as a one-process run writes it);
        None. Memory: every rank's rows, in plan order (a DataFrame of
        :data:`~cwlens.faithfulness.results.COLUMNS`)."""
        if isinstance(self.writer, ResultsWriter):
            if distributed.world().main:
                merge_shards(Path(self.out), self.rows_per_sample, self.order)
            return None
        import pandas as pd  # heavy: pandas, imported on use

        rows = [r for part in distributed.gather(self.writer.rows) for r in part]
        position = {s: i for i, s in enumerate(self.order)}
        rows.sort(key=lambda r: position[r["sample_id"]])  # stable: a sample's rows stay in order
        return pd.DataFrame(rows, columns=list(COLUMNS))
