"""The whole sink analysis on a model and a dataset sample: tables (CSV), figures, summary.

Used by ``cwlens sinks``. Texts are tokenized alone, truncated to ``max_tokens``,
sorted by length (less padding), left-padded in batches; the sink of each row is its
first real token. Every table carries the dataset sample id.
"""

from pathlib import Path
from typing import NamedTuple

import pandas as pd
import torch

from cwlens.engine import adapter, validation
from cwlens.engine.batching import context_cap, pad_batch, token_ids
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle
from cwlens.engine.streaming import stream_geometry
from cwlens.errors import EmptyInputError, InvalidArgumentError
from cwlens.runs import distributed
from cwlens.runs.jobs import Job, JobSpec, run_job
from cwlens.runs.progress import bar, tick
from cwlens.sinks import alignment, norm_intervention, observed, statistics, sweep
from cwlens.sinks.config import SinkConfig
from cwlens.sinks.store import (
    MANIFEST,
    RAW_DIR,
    RAW_PARTS,
    TABLES,
    RawStore,
    SinkResultsError,
    load_tables,
    save_tables,
)
from cwlens.sinks.summary import (
    format_summary,
    read_run_info,
    read_summary,
    summarize,
    to_json,
    write_summary,
)

__all__ = [
    "MANIFEST", "RAW_DIR", "RAW_PARTS", "TABLES", "RawStore", "SinkBatch", "SinkConfig", "SinkJob",
    "SinkResultsError", "analyse", "analyse_batch", "batches", "derive", "format_summary",
    "load_tables", "read_run_info", "read_summary", "run_to_folder", "save_tables", "summarize",
    "to_json", "write_summary",
]


class SinkBatch(NamedTuple):
    """One forward pass: the sample ids, the left-padded tokens and their mask."""

    ids: list[str]
    tokens: torch.Tensor
    mask: torch.Tensor


def batches(handle: ModelHandle, samples, max_tokens: int | None, batch_size: int,
            past_context: bool = False) -> list[SinkBatch]:
    """The plan: :class:`SinkBatch` es with texts sorted by token length (texts longer
    than the model's context cut to it with a note, or with ``past_context`` run past it
    on rotary models: docs/inputs.md)."""
    rows = [(s.id, token_ids(handle, s.text, truncate=False)) for s in samples]
    cap = context_cap(handle.info, max_tokens, [len(r[1]) for r in rows], past_context=past_context)
    rows = [(i, ids[:cap]) for i, ids in rows]
    rows.sort(key=lambda r: len(r[1]))
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        tokens, mask = pad_batch(handle, [r[1] for r in chunk])
        out.append(SinkBatch([r[0] for r in chunk], tokens, mask))
    return out


def analyse_batch(handle: ModelHandle, bi: int, batch: SinkBatch, cfg: SinkConfig) -> dict[str, pd.DataFrame]:
    """The raw tables (:data:`RAW_PARTS`) of batch ``bi``: per-sample rows, and per-batch
    histogram counts, mean curves and head measures (combined over batches by :func:`derive`).

    One streamed forward pass: each layer's geometry is built once and every analysis reads
    it while the model runs (no cache of every layer's pattern)."""
    ids, tokens, mask = batch
    causal = not handle.is_encoder
    swept = bi < cfg.swept_batches
    # the swept check (recomputing norms from the changed pattern) on the first batch;
    # the closed form on all of them
    _, per_layer = stream_geometry(
        handle, tokens,
        lambda ly, geo: _layer_tables(geo, ly, batch, cfg.eps, swept, causal),
        attention_mask=mask,
    )
    tick()  # progress: one forward pass (cwlens.runs.progress; passes_per_batch in all)
    parts = {k: pd.concat([t[k] for t in per_layer], ignore_index=True) for k in per_layer[0]}
    if cfg.intervention:
        parts["ppl"], parts["norm"] = norm_intervention.sink_norm_intervention(
            handle, tokens, mask, scales=cfg.scales, seed=cfg.seed, sample_ids=ids
        )
    return parts


def passes_per_batch(cfg: SinkConfig) -> int:
    """The forward passes :func:`analyse_batch` runs: the streamed analysis, and with the
    intervention a clean pass and one per scale for the sink and for the random control.
    What the progress bar counts."""
    return 1 + (1 + 2 * len(cfg.scales) if cfg.intervention else 0)


def _check_model(handle: ModelHandle, intervention: bool) -> None:
    """Fail before any compute, not at the first intervention."""
    if intervention:
        adapter.require_next_token_model(
            handle.info, "The sink-norm intervention",
            "Run the sink analysis with --no-intervention (intervention=False) on encoders.",
        )


def derive(parts: dict[str, list[pd.DataFrame]], eps: float = statistics.EPS_GU) -> dict[str, pd.DataFrame]:
    """All tables of :data:`TABLES` from the raw tables of every batch, in batch order."""
    t = {k: pd.concat(v, ignore_index=True) for k, v in parts.items() if v}
    t["heads"] = statistics.head_summary(t["stats"], eps)
    t["layers"] = statistics.layer_summary(t["stats"], eps)
    t["histograms"] = t["histograms"].groupby(
        ["layer", "measure", "bin_left", "bin_right"], as_index=False
    )["count"].sum()
    t["alignment_layers"] = alignment.histogram_summary(t["histograms"])
    t["curves"] = sweep.curve_summary(t["curves"])
    t["observed"] = observed.combine_bins(t["observed"])
    t["observed_heads"] = observed.head_fits(t["observed"])
    t["observed_layers"] = observed.layer_fits(t["observed"])
    if "ppl" in t:
        t["ppl_summary"] = norm_intervention.ppl_summary(t["ppl"])
        t["norm"] = norm_intervention.head_summary(t["norm"])
    return t


def check_samples(samples) -> list:
    """``samples`` as a list of text samples (``.id`` and ``.text``), each id once: the
    tables are keyed by sample id, so a repeated id kept one text (or broke pandas)."""
    fix = ("pass text samples: cwlens.datasets.load_dataset(name, n=...), or "
           "TextSample(id, text, dataset) from cwlens.datasets for your own texts")
    if isinstance(samples, str | bytes) or not hasattr(samples, "__iter__"):
        raise InvalidArgumentError(f"samples must be a list of text samples; got {samples!r}: {fix}.")
    samples = list(samples)
    if not samples:
        raise EmptyInputError("No samples to analyse: pass at least one text.")
    for s in samples:
        if not (isinstance(getattr(s, "id", None), str) and isinstance(getattr(s, "text", None), str)):
            raise InvalidArgumentError(
                f"samples must hold text samples (with .id and .text); got "
                f"{type(s).__name__} {str(s)[:60]!r}: {fix}.")
    validation.unique_ids([s.id for s in samples], "the tables")
    return samples


@takes_model
def analyse(model: ModelLike, samples, config: SinkConfig | None = None, *, progress: bool = True,
            **settings) -> dict[str, pd.DataFrame]:
    """All tables of :data:`TABLES` for ``samples`` (a list of ``TextSample``), in memory
    (:func:`run_to_folder` does the same with a resumable store on disk). ``settings``:
    fields of :class:`~cwlens.sinks.config.SinkConfig` (``max_tokens=64``, ...) that
    replace those of ``config``."""
    cfg = SinkConfig.of(config, **settings)
    if not samples:
        raise EmptyInputError("No samples to analyse: pass at least one text.")
    samples = check_samples(samples)
    _check_model(model, cfg.intervention)
    parts: dict[str, list[pd.DataFrame]] = {k: [] for k in RAW_PARTS}
    todo = batches(model, samples, cfg.max_tokens, cfg.batch_size, cfg.past_context)
    with validation.past_context_said(cfg.past_context), \
            bar(len(todo) * passes_per_batch(cfg), "sinks", "pass", enabled=progress, ticks=True):
        for bi, batch in enumerate(todo):
            for k, v in analyse_batch(model, bi, batch, cfg).items():
                parts[k].append(v)
    return derive(parts, cfg.eps)


class SinkJob(Job):
    """The sink analysis as a :class:`~cwlens.runs.jobs.Job`: items are the batches missing
    from the :class:`RawStore` (files of separate batches never collide, so the ranks of
    a torchrun job share the folder); the merge derives the tables from every batch, and
    rank 0 writes them."""

    def __init__(self, handle: ModelHandle, plan: list[SinkBatch], cfg: SinkConfig, spec: JobSpec,
                 on_batch=None):
        self.handle, self.plan, self.cfg, self.spec, self.on_batch = handle, plan, cfg, spec, on_batch

    def open(self, resume, rank):
        self.store = RawStore(self.spec.folder, self.spec.config, resume)

    def survey(self):
        return [bi for bi, batch in enumerate(self.plan) if not self.store.done(bi, batch.ids)]

    def adopt(self, view):
        self.missing = list(view)

    def todo(self):
        return self.missing

    ticks = True  # progress in forward passes, ticked by analyse_batch

    def total(self):
        return len(self.plan) * passes_per_batch(self.cfg)

    def initial(self):
        return (len(self.plan) - len(self.missing)) * passes_per_batch(self.cfg)

    def counter(self):
        per = passes_per_batch(self.cfg)
        return lambda: per * len(list(self.store.dir.glob("batch-*.json")))

    def do(self, bi):
        batch = self.plan[bi]
        self.store.write(bi, batch.ids, analyse_batch(self.handle, bi, batch, self.cfg))
        if self.on_batch is not None:
            self.on_batch(bi)
        return 0  # its forward passes ticked as they ran

    def merge(self):
        tables = derive(self.store.load(len(self.plan)), self.cfg.eps)
        if distributed.world().main:
            save_tables(tables, self.spec.folder)
        return tables


@takes_model
def run_to_folder(model: ModelLike, samples, out_dir, config: SinkConfig | None = None, *, resume: bool = True,
                  model_name: str | None = None, progress: bool = True, on_batch=None,
                  **settings) -> dict[str, pd.DataFrame]:
    """:func:`analyse` with every batch saved as it finishes (:class:`RawStore`), resumed
    on a rerun, and the derived tables written atomically from the store at the end
    (:func:`save_tables`), all under the folder lock
    (:func:`cwlens.runs.results_io.results_lock`). ``on_batch(bi)`` runs after each saved batch.

    In a torchrun job (:mod:`cwlens.runs.distributed`) every rank checks that all computed the
    same configuration, rank 0 opens the store (``resume=False`` empties it) and says
    which batches are missing, those are dealt round-robin over the ranks (each batch is
    the batch of a one-process run), and after a barrier rank 0 writes the tables; every
    rank returns them (:func:`cwlens.runs.jobs.run_job`). Its progress counts forward
    passes (:func:`passes_per_batch` per batch)."""
    cfg = SinkConfig.of(config, **settings)
    _check_model(model, cfg.intervention)
    distributed.require_session()
    samples = check_samples(samples)
    plan = batches(model, samples, cfg.max_tokens, cfg.batch_size, cfg.past_context)
    record = {"model": model_name or model.name or "model",
              "samples": [s.id for s in samples], **cfg.record()}
    spec = JobSpec("sinks configuration", record, Path(out_dir), resume, len(plan), "sinks",
                   "pass", progress)
    with validation.past_context_said(cfg.past_context):  # batches said it, once
        return run_job(SinkJob(model, plan, cfg, spec, on_batch))


def _layer_tables(geo, layer, batch: SinkBatch, eps, swept, causal=True) -> dict[str, pd.DataFrame]:
    """Every per-layer sink table from one layer's geometry: statistics, alignment,
    histograms, and the sink-rate sweep (``swept``: also recompute norms from the changed
    pattern, the check of the closed form; done on the first batch)."""
    ids = batch.ids
    mask = batch.mask.to(geo.pattern.device)  # a model split over GPUs: this layer's device
    al, hist = alignment.layer_tables(geo, layer, mask, ids)
    s, c = sweep.layer_sweep_tables(geo, layer, mask, ids, swept=swept)
    return {"stats": statistics.layer_frame(geo, layer, mask, ids, eps, causal=causal),
            "alignment": al, "histograms": hist, "sweep": s, "curves": c,
            "observed": observed.layer_bins(geo, layer, mask)}


