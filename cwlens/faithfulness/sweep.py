"""The faithfulness sweep: one streamed clean pass per batch serves every metric, then one
masked forward pass per (metric, mode, rate, layer set).

    result = run_faithfulness(model, "gsm8k", FaithfulnessConfig(rates=(0.1, 0.3)), n=50,
                              out="runs/faithfulness/gsm8k.jsonl")
    result.summary()          # mean and bootstrap CI per cell

Per batch (:mod:`~cwlens.faithfulness.passes`): one clean forward pass on the streaming
engine (:func:`cwlens.stream_geometry`) gives the clean scores and, one layer at a time
while the model runs, every metric's ranking (:mod:`~cwlens.faithfulness.ranking`) and the
masks the conditions need, kept bit-packed (:class:`~cwlens.core.bitmask.PackedMask`):
memory is one layer's scores and ranks plus ``layers x n^2 / 8`` bytes per distinct mask,
never a cache of every layer's pattern. Each condition is then one ``run_masked``
(:mod:`~cwlens.engine.interventions.value_masking`). Long texts at row scope take the
lockstep path instead (:mod:`~cwlens.faithfulness.lockstep`, ``ranking_path``): the clean
and the masked copies run as one batch and each query block's rows are ranked and masked
as they are computed, with no ``[batch, head, n, n]`` tensor and no packed mask. Conditions whose masks are provably
identical share one forward pass (``reuse=True``): rate 0 (nothing masked = clean), rate 1
(every eligible entry, whatever the metric or mode), and value_weighted_output_normalized
with ``scope="row"``, which orders every row exactly as value_weighted (``||o||`` is
constant along a row). Batches are fixed by the sample list and the configuration
(:func:`~cwlens.faithfulness.units.plan_batches`), so a resumed run computes bit-identical
numbers; the run itself (lock, resume, shards over torchrun ranks, progress, merge) is a
:class:`cwlens.runs.jobs.Job`.

Peers' metrics: ``alti`` is a geometry metric and is ranked inside the streamed pass like
the others (at ``O(n^2 d_model)`` per layer instead of ``O(n^2 d_head)``). The supervised
``attention_gradient`` / ``attention_gradient_abs`` need gradients, which the no-grad
streamed pass cannot give: when asked for, each batch first runs one more forward +
backward pass (:func:`cwlens.engine.gradients.attention_gradient`, about 3x a forward and the
memory of a training step, every layer's scores kept until the clean pass ranks them).
"""

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from cwlens.datasets import ChoiceItem, TextSample, load_dataset
from cwlens.engine import adapter, validation
from cwlens.engine.batching import check_past_context
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle
from cwlens.errors import EmptyInputError, InvalidArgumentError
from cwlens.faithfulness.added_metrics import metrics_already_done
from cwlens.faithfulness.causal_scope import require_causal
from cwlens.faithfulness.config import Condition, FaithfulnessConfig
from cwlens.faithfulness.passes import SweepStats, batch_outputs, passes_per_batch
from cwlens.faithfulness.results import read_results, summarize
from cwlens.faithfulness.rows_job import RowsJob
from cwlens.faithfulness.units import Unit, choice_units, plan_batches, text_units
from cwlens.runs import distributed
from cwlens.runs.jobs import JobSpec, run_job

__all__ = ["Condition", "FaithfulnessConfig", "FaithfulnessResult", "SweepStats", "run_faithfulness"]


@dataclass(frozen=True)
class FaithfulnessResult:
    """Rows of a sweep (``table``: the tidy DataFrame) and how it was made."""

    table: object
    config: FaithfulnessConfig
    path: str | None
    stats: SweepStats = field(default_factory=SweepStats)

    def to_dataframe(self):
        return self.table

    def summary(self, **kwargs):
        return summarize(self.table, **kwargs)


def _rows(base, unit_id, results, conditions, u_pos):
    rows = []
    clean = results[None][u_pos]
    for measure, value in clean.items():
        rows.append({**base, "metric": "none", "mode": "clean", "rate": 0.0, "layers": "none",
                     "sample_id": unit_id, "measure": measure, "value": value})
    for c in conditions:
        out = dict(results[c][u_pos])
        if "ppl" in out:
            out["delta_ppl"] = out["ppl"] - clean["ppl"]
        for measure, value in out.items():
            rows.append({**base, "metric": c.metric, "mode": c.mode, "rate": c.rate,
                         "layers": c.layers_label, "sample_id": unit_id, "measure": measure,
                         "value": value})
    return rows


class SweepRun(NamedTuple):
    """What a sweep writes besides its configuration."""

    columns: dict  # the setting columns of every row (cwlens.faithfulness.results.SETTING)
    out: object  # the .jsonl path, or None: rows in memory
    is_choice: bool  # multiple-choice items (3 clean measures) or documents (2)
    on_sample: Callable[[str], None] | None = None


class SweepJob(RowsJob):
    """The sweep as a :class:`~cwlens.runs.jobs.Job`: items are batches of the plan that hold
    an unfinished sample; the whole batch is computed (so each sample gets exactly the
    numbers of an uninterrupted run) and the rows of its unfinished samples are appended,
    one sample at a time. Its progress counts forward passes, ticked as each one ends
    (:func:`passes_per_batch` of them per batch)."""

    ticks = True

    def __init__(self, handle: ModelHandle, units: list[Unit], cfg: FaithfulnessConfig, spec: JobSpec,
                 run: SweepRun):
        self.handle, self.units, self.cfg, self.run = handle, units, cfg, run
        self.conditions = cfg.conditions(handle.n_layers)
        self.batches = plan_batches(units, cfg.batch_tokens)
        order = [units[u].sample_id for b in self.batches for u in b]
        super().__init__(spec, run.out, self._rows_per_sample(), order)
        self.stats = SweepStats()
        self.added: tuple[str, ...] | None = None

    PER_CONDITION = 5  # 3 measures, tied_share, first_token_share

    def _rows_per_sample(self) -> int:
        return (3 if self.run.is_choice else 2) + self.PER_CONDITION * len(self.conditions)

    def open(self, resume, rank):
        """Open the store; where it holds a finished run of some of this run's metrics,
        only the others are computed (:mod:`cwlens.faithfulness.added_metrics`)."""
        if self.spec.folder is not None and resume:
            n_layers = self.handle.n_layers
            per_metric = len(replace(self.cfg, metrics=self.cfg.metrics[:1]).conditions(n_layers))
            done = metrics_already_done(
                self.out, self.spec.config, self.cfg.metrics, self.order,
                self.PER_CONDITION * per_metric, 3 if self.run.is_choice else 2)
            if done:
                self.added = tuple(m for m in self.cfg.metrics if m not in done)
                self.cfg = replace(self.cfg, metrics=self.added)
                self.conditions = self.cfg.conditions(n_layers)
                self.rows_per_sample = self._rows_per_sample()
        super().open(resume, rank)

    def only_metrics(self):
        return self.added

    def todo(self):
        return [b for b in self.batches if any(self.units[u].sample_id not in self.writer.done for u in b)]

    def passes(self) -> int:
        return passes_per_batch(self.conditions, self.cfg)

    def total(self):
        return len(self.batches) * self.passes()

    def initial(self):
        return (len(self.batches) - len(self.todo())) * self.passes()

    def counter(self):
        """torchrun: the forward passes of the samples every rank has written."""
        samples = super().counter()
        if samples is None:
            return None
        total, n = self.total(), len(self.order)
        return lambda: min(total, round(samples() * total / n))

    def do(self, batch):
        results = batch_outputs(self.handle, self.units, batch, self.cfg, self.conditions, self.stats)
        self.stats.n_batches += 1
        written = 0
        for pos, u in enumerate(batch):
            sample_id = self.units[u].sample_id
            if sample_id not in self.writer.done:
                self.writer.write_sample(_rows(self.run.columns, sample_id, results, self.conditions, pos))
                written += 1
                if self.run.on_sample is not None:
                    self.run.on_sample(sample_id)
        return 0  # progress: its forward passes ticked as they ran


def _job_stats(stats: SweepStats) -> SweepStats:
    """Counts and seconds summed over the ranks of a torchrun job (wall: the longest)."""
    every = distributed.gather(asdict(stats))
    total = SweepStats(**{k: sum(s[k] for s in every) for k in every[0]})
    total.wall_seconds = max(s["wall_seconds"] for s in every)
    return total


def _require_something_masked(units, cfg: FaithfulnessConfig) -> None:
    """A row-scope run on documents so short that no rate masks any entry of any scored
    row (``round_half_up(r * n) = 0`` for the longest, ``n`` eligible keys) would print a
    table of exact zeros that reads as "no damage": refused, naming the fix."""
    if cfg.scope != "row" or not cfg.causal_only:
        return

    longest = max(len(u.sequences[0]) for u in units) - 1  # the last scored row's keys
    eligible = longest - (0 if cfg.mask_first_token else 1)
    if all(math.floor(r * eligible + 0.5) == 0 for r in cfg.rates):
        raise InvalidArgumentError(
            f"no rate of {', '.join(f'{r:g}' for r in cfg.rates)} masks any entry: the longest "
            f"scored row has {eligible} eligible key(s), so k = round_half_up(rate x {eligible}) "
            "= 0 everywhere and every cell would be 0 by construction. Give longer texts "
            "(--max-tokens, --file), higher rates"
            + ("" if cfg.mask_first_token else ", or let the first token be masked") + ".")


def _check_samples(samples: list) -> None:
    """One kind of sample (documents or multiple-choice items) from one dataset, each id
    once: the rows are keyed by sample id and labelled with one dataset name, so a repeated
    id kept one sample and a second dataset's rows were filed under the first's name."""
    fix = ("load them with cwlens.datasets.load_dataset(name, n=...), or build "
           "TextSample(id, text, dataset) / ChoiceItem objects for your own")
    for s in samples:
        if not isinstance(s, TextSample | ChoiceItem):
            raise InvalidArgumentError(
                f"the samples must be TextSample or ChoiceItem objects; got {type(s).__name__} "
                f"{str(s)[:60]!r}: {fix}.")
    kinds = {type(s).__name__ for s in samples}
    if len(kinds) > 1:
        raise InvalidArgumentError(
            "the samples mix documents (TextSample) and multiple-choice items (ChoiceItem): "
            "they are scored differently (ΔNLL vs the label margin); run each kind separately.")
    datasets = list(dict.fromkeys(s.dataset for s in samples))
    if len(datasets) > 1:
        raise InvalidArgumentError(
            f"the samples come from {len(datasets)} datasets ({', '.join(map(str, datasets))}); "
            "a run's rows carry one dataset name: run each dataset separately (one results "
            "file each, as cwlens faithfulness --dataset a,b does).")
    validation.unique_ids([s.id for s in samples], "the rows")


def dataset_name(samples, num_fewshot: int = 0) -> str:
    """The ``dataset`` a run's rows carry: the samples' dataset, ``_<k>shot`` added for
    multiple-choice items with ``k`` exemplars."""
    shots = isinstance(samples[0], ChoiceItem) and num_fewshot
    return samples[0].dataset + (f"_{num_fewshot}shot" if shots else "")


def stored_config(model_name: str, dataset: str, cfg: FaithfulnessConfig, sample_ids) -> dict:
    """The configuration a results file records beside it (``<base>.config.json``), which
    a resumed run must match. ``ranking_path`` changes how, not what: a run resumes
    whichever path made its rows."""
    return {"model": model_name, "dataset": dataset,
            **{k: v for k, v in asdict(cfg).items()
               if k != "ranking_path" and not (k == "prepend_bos" and v)},  # (older runs: BOS)
            "samples": list(sample_ids)}


@takes_model
def run_faithfulness(
    model: ModelLike,
    dataset,
    config: FaithfulnessConfig | None = None,
    *,
    out=None,
    resume: bool = True,
    model_name: str | None = None,
    progress: bool = True,
    on_sample: Callable[[str], None] | None = None,
    **load,
) -> FaithfulnessResult:
    """Run the sweep on a dataset name (``load_dataset(dataset, **load)``: ``n``,
    ``num_fewshot``, ...) or a list of :class:`~cwlens.datasets.TextSample` /
    :class:`~cwlens.datasets.ChoiceItem` (``num_fewshot`` then only names the dataset).

    ``out``: a ``.jsonl`` path; rows are appended as each sample finishes and a rerun
    with the same configuration resumes (``resume=False`` starts afresh). None keeps
    the rows in memory only. ``on_sample(sample_id)`` is called after each sample.
    """
    adapter.require_next_token_model(
        model.info, "The faithfulness test",
        "Use a decoder here; for an encoder, the sentence-embedding damage task is "
        "cwlens.faithfulness.encoder.embedding_damage (CLI: cwlens replicate --models <encoder>).",
    )
    cfg = config or FaithfulnessConfig()
    require_causal(cfg.scope, cfg.causal_only, "the next-token faithfulness test (ΔNLL)")
    adapter.require_metrics(model, cfg.metrics)
    if out is not None and Path(out).is_dir():
        raise InvalidArgumentError(
            f"out={str(out)!r} is a folder; pass the path of a .jsonl results file, e.g. "
            f"{str(Path(out) / 'results.jsonl')!r} (the CLI's --out is the folder).")
    t0 = time.perf_counter()
    num_fewshot = load.get("num_fewshot", 0)
    samples = load_dataset(dataset, **load) if isinstance(dataset, str) else list(dataset)
    if not samples:
        raise EmptyInputError("No samples to evaluate: pass a dataset name or a non-empty list.")
    _check_samples(samples)
    is_choice = isinstance(samples[0], ChoiceItem)
    ds_name = dataset_name(samples, num_fewshot)
    name = model_name or model.name or "model"
    adapter.resolve_layers(model.n_layers, list(cfg.layers) if cfg.layers is not None else None)
    check_past_context(model.info, cfg.past_context)
    units = choice_units(model, samples, cfg.prepend_bos) if is_choice else \
        text_units(model, samples, cfg.max_tokens, cfg.past_context, cfg.prepend_bos)
    if not is_choice:
        _require_something_masked(units, cfg)
    run_config = stored_config(name, ds_name, cfg, [u.sample_id for u in units])
    columns = {"model": name, "dataset": ds_name, **cfg.provenance()}
    distributed.require_session()
    spec = JobSpec("sweep configuration", run_config, Path(out).parent if out else None, resume,
                   len(units), ds_name, "pass", progress)
    job = SweepJob(model, units, cfg, spec, SweepRun(columns, out, is_choice, on_sample))
    with validation.past_context_said(cfg.past_context):  # text_units said it, once
        table = run_job(job)
    job.stats.wall_seconds = time.perf_counter() - t0
    stats = _job_stats(job.stats)
    if out:
        table = read_results(out)
    return FaithfulnessResult(table, cfg, str(out) if out else None, stats)
