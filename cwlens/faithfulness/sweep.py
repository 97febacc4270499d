"""The faithfulness sweep: one streamed clean pass per batch serves every metric, then one
masked forward pass per (metric, mode, rate, layer set).

    result = run_faithfulness(model, "gsm8k", FaithfulnessConfig(rates=(0.1, 0.3)), n=50,
                              out="runs/faithfulness/gsm8k.jsonl")
    result.summary()          # mean and bootstrap CI per cell

Per batch: one clean forward pass on the streaming engine (:func:`cwlens.stream_geometry`)
gives the clean scores and, one layer at a time while the model runs, every metric's
ranking (:mod:`~cwlens.faithfulness.ranking`) and the masks the conditions need, kept
bit-packed (:class:`~cwlens.core.bitmask.PackedMask`): memory is one layer's scores and
ranks plus ``layers x n^2 / 8`` bytes per distinct mask, never a cache of every layer's
pattern. Each condition is then one
``run_masked`` (:mod:`~cwlens.interventions.value_masking`). Conditions whose masks are
provably identical share one forward pass (``reuse=True``): rate 0 (nothing masked =
clean), rate 1 (every eligible entry, whatever the metric or mode), and
value_weighted_output_normalized with ``scope="row"``, which orders every row exactly as
value_weighted (``||o||`` is constant along a row). Batches are fixed by the sample list and the
configuration, so a resumed run computes bit-identical numbers.

Peers' metrics: ``alti`` is a geometry metric and is ranked inside the streamed pass like
the others (at ``O(n^2 d_model)`` per layer instead of ``O(n^2 d_head)``). The supervised
``attention_gradient`` / ``attention_gradient_abs`` need gradients, which the no-grad
streamed pass cannot give: when asked for, each batch first runs one more forward +
backward pass (:func:`cwlens.gradients.attention_gradient`, about 3x a forward and the
memory of a training step, every layer's scores kept until the clean pass ranks them).
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from cwlens import adapter, validation
from cwlens._types import Kind, Mode, RankingMetric, Scope
from cwlens.batching import pad_batch
from cwlens.core.bitmask import PackedMask
from cwlens.core.geometry import check_kind
from cwlens.errors import EmptyInputError, InvalidArgumentError, LayerOutOfRangeError
from cwlens.faithfulness import choice, lm
from cwlens.faithfulness.causal_scope import causal_ranking, require_causal
from cwlens.faithfulness.ranking import (
    ALL_RANKINGS,
    MODES,
    RANKINGS,
    SCOPES,
    check_option,
    eligible_entries,
    first_token,
    mask_counts,
    mask_shares,
    metric_scores,
    random_scores,
    rank_entries,
    tiebreak_scores,
)
from cwlens.faithfulness.results import ResultsWriter
from cwlens.gradients import attention_gradient
from cwlens.interventions.value_masking import run_masked
from cwlens.metrics import GRADIENT
from cwlens.results_io import results_lock
from cwlens.streaming import stream_geometry


@dataclass(frozen=True)
class FaithfulnessConfig:
    """Every choice of the protocol, with its default (see ``docs/faithfulness.md``).

    Attributes:
        metrics: rankings compared (default: all of :data:`~cwlens.faithfulness.ranking.RANKINGS`).
        rates: fractions of eligible entries removed per scope unit (default 0.1, 0.3, 0.5).
        modes: ``comprehensiveness`` (remove top-ranked) and/or ``sufficiency`` (bottom).
        scope: ``"row"`` (per head and query, default), ``"head"`` or ``"layer"``.
        layers: layers masked; None = all (default).
        per_layer: False (default): the layers are masked all at once; True: one at a
            time (one condition per layer, ``n_layers`` times the cost).
        kind: ``"inter"`` (default) or ``"intra"``: the output the value-aware metrics
            project on.
        causal_only: only keys ``j <= i`` are eligible (default True).
        mask_first_token: the first token (BOS / sink) is eligible (default True).
        renormalize: give the removed attention mass back to the other keys (default
            False: the masked terms are just removed).
        seed: seed of the ``random`` control.
        max_tokens: truncate language-modelling documents to their first ``max_tokens``
            tokens (default 512; None: whole documents -- the clean pass streams, but each
            distinct mask keeps ``layers x n^2 / 8`` bytes and masked passes grow as n^2).
        batch_tokens: padded tokens per forward pass (default 2048).
        reuse: share forward passes between conditions with identical masks (default True).
    """

    metrics: tuple[str, ...] = RANKINGS
    rates: tuple[float, ...] = (0.1, 0.3, 0.5)
    modes: tuple[Mode, ...] = MODES
    scope: Scope = "row"
    layers: tuple[int, ...] | None = None
    per_layer: bool = False
    kind: Kind = "inter"
    causal_only: bool = True
    mask_first_token: bool = True
    renormalize: bool = False
    seed: int = 0
    max_tokens: int | None = 512
    batch_tokens: int = 2048
    reuse: bool = True

    def __post_init__(self):
        # repeated entries would repeat conditions and count every sample twice
        for name in ("metrics", "rates", "modes", "layers"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(dict.fromkeys(value)))
        for m in self.metrics:
            check_option(m, ALL_RANKINGS, "metric")
        for mode in self.modes:
            check_option(mode, MODES, "mode")
        check_option(self.scope, SCOPES, "scope")
        check_kind(self.kind)
        for name in ("metrics", "rates", "modes"):
            if not getattr(self, name):
                raise InvalidArgumentError(f"{name} is empty: give at least one.")
        for r in self.rates:
            validation.rate(r, "rates")
        validation.positive_int(self.batch_tokens, "batch_tokens")
        validation.max_tokens(self.max_tokens)
        if self.layers is not None:
            for ly in self.layers:
                if isinstance(ly, bool) or not isinstance(ly, int) or ly < 0:
                    raise LayerOutOfRangeError(
                        f"layers must be non-negative ints (or None for all); got {ly!r}."
                    )

    def layer_sets(self, n_layers: int) -> list[tuple[str, tuple[int, ...]]]:
        """``[(label, layers)]``: one set (``"all"`` or ``"0,3"``) or one per layer."""
        layers = tuple(range(n_layers)) if self.layers is None else tuple(self.layers)
        if self.per_layer:
            return [(str(ly), (ly,)) for ly in layers]
        label = "all" if self.layers is None else ",".join(map(str, layers))
        return [(label, layers)]

    def conditions(self, n_layers: int) -> list["Condition"]:
        return [
            Condition(metric, mode, float(rate), label, layers)
            for label, layers in self.layer_sets(n_layers)
            for metric in self.metrics
            for mode in self.modes
            for rate in self.rates
        ]


@dataclass(frozen=True)
class Condition:
    metric: str  # a name of cwlens.metrics.REGISTRY
    mode: Mode
    rate: float
    layers_label: str
    layers: tuple[int, ...]


@dataclass
class _Unit:
    """One sample: its id, the input sequences it needs, and how to score them."""

    sample_id: str
    sequences: list[list[int]]
    score: Callable  # (logits, rows, offsets) -> {measure: value}


def _text_units(model, samples, max_tokens) -> list[_Unit]:
    from cwlens.batching import context_cap, token_ids

    def score(logits, rows, offsets, tokens, mask):
        row = rows[0]
        out = lm.document_scores(logits[row : row + 1], tokens[row : row + 1], mask[row : row + 1])
        return {"nll": out[0]["nll"], "ppl": out[0]["ppl"]}

    all_ids = [token_ids(model, s.text, truncate=False).tolist() for s in samples]
    cap = context_cap(model, max_tokens, [len(ids) for ids in all_ids], "documents")
    return [_Unit(s.id, [ids[:cap] if cap else ids], score)
            for s, ids in zip(samples, all_ids, strict=True)]


def _choice_units(model, items) -> list[_Unit]:
    requests = choice.encode_items(model, items)
    by_item: dict[int, list] = {}
    for r in requests:
        by_item.setdefault(r.item, []).append(r)
    units = []
    for index, item in enumerate(items):
        reqs = by_item[index]
        inputs, which = choice.unique_inputs(reqs)
        _fits_context(model, item.id, inputs)

        def score(logits, rows, offsets, tokens, mask, reqs=reqs, which=which, item=item):
            lls = [choice.continuation_logprob(logits, rows[w], offsets[w], r)
                   for r, w in zip(reqs, which, strict=True)]
            return choice.item_scores(lls, [r.continuation_chars for r in reqs], item.gold)

        units.append(_Unit(item.id, [list(x) for x in inputs], score))
    return units


def _fits_context(model, item_id, inputs) -> None:
    """A choice prompt cannot be cut without losing its question: refuse one longer than
    the model's context (docs/inputs.md)."""
    from cwlens.adapter import context_length
    from cwlens.errors import InputTooLongError

    limit = context_length(model)
    longest = max((len(x) for x in inputs), default=0)
    if limit is not None and longest > limit:
        raise InputTooLongError(
            f"item {item_id}: a prompt with its answer has {longest} tokens, more than the "
            f"model's context of {limit} (n_ctx); use fewer few-shot examples (--num-fewshot) "
            "or a model with a longer context.")


def plan_batches(units: Sequence[_Unit], batch_tokens: int) -> list[list[int]]:
    """Unit indices per batch: sorted by length (stable), at most ``batch_tokens`` padded
    tokens per batch (a longer unit gets a batch of its own)."""
    order = sorted(range(len(units)), key=lambda i: max(map(len, units[i].sequences)))
    batches: list[list[int]] = []
    current: list[int] = []
    n_seq, longest = 0, 0
    for i in order:
        seqs = units[i].sequences
        new_longest = max(longest, *map(len, seqs))
        if current and (n_seq + len(seqs)) * new_longest > batch_tokens:
            batches.append(current)
            current, n_seq, new_longest = [], 0, max(map(len, seqs))
        current.append(i)
        n_seq += len(seqs)
        longest = new_longest
    if current:
        batches.append(current)
    return batches


@dataclass
class SweepStats:
    n_batches: int = 0
    n_forwards: int = 0  # clean (cached) + masked forward passes actually run
    forward_seconds: float = 0.0
    ranking_seconds: float = 0.0
    wall_seconds: float = 0.0


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
        from cwlens.faithfulness.results import summarize

        return summarize(self.table, **kwargs)


class _MemoryWriter:
    def __init__(self, rows_per_sample):
        self.rows, self.done, self.rows_per_sample = [], set(), rows_per_sample

    def write_sample(self, rows):
        self.rows += rows
        self.done.add(rows[0]["sample_id"])


def _scored(metric: RankingMetric, cfg: FaithfulnessConfig) -> RankingMetric:
    """At row scope ``||o||`` (inter: ``||o_i||``, intra: ``||o_i^h||``) is one positive
    constant per row, so value_weighted_output_normalized orders every row exactly as
    value_weighted: rank it by value_weighted, so float rounding cannot make the two
    differ (and they share their forward passes)."""
    if cfg.scope == "row" and metric == "value_weighted_output_normalized":
        return "value_weighted"
    return metric


def _mask_jobs(conditions, cfg) -> tuple[dict, dict]:  # noqa: C901
    """``(jobs, key_of)``: the distinct masks the conditions need, and each condition's.

    A job is ``key -> (ranking metric or None, mode, rate, layers)``. Conditions whose
    masks are provably identical share one key (``reuse``): rate 0 needs no mask (the clean
    pass), rate 1 removes every eligible entry whatever the metric (``None``: no ranking),
    and vw-output-normalised at row scope ranks as value_weighted (:func:`_scored`).
    """
    jobs: dict = {}
    key_of: dict = {}
    for c in conditions:
        if cfg.reuse and c.rate == 0.0:
            key_of[c] = None
            continue
        key: tuple
        if cfg.reuse and c.rate == 1.0:
            key = ("all", c.layers)
            jobs.setdefault(key, (None, c.mode, c.rate, c.layers))
        else:
            ident = _scored(c.metric, cfg) if cfg.reuse else c.metric
            key = (ident, c.mode, c.rate, c.layers)
            jobs.setdefault(key, (_scored(c.metric, cfg), c.mode, c.rate, c.layers))
        key_of[c] = key
    return jobs, key_of


def _layer_masks(geo, layer, mask, jobs, cfg, keys, stats, window=None, gradients=None,
                 counts=None) -> dict:
    """Rank one layer's entries by every metric some job needs; ``{job key: PackedMask}``.

    Runs inside the clean forward pass (:func:`cwlens.stream_geometry`), so only one
    layer's scores and ranks exist at a time; the masks are kept bit-packed. Ties are
    broken by the seeded random order of :func:`~cwlens.faithfulness.ranking.tiebreak_scores`;
    ``counts[job key]`` (``[batch, 3]``: removed, chosen by the tie-break, on the first
    token) is summed over the layers where given.
    """
    t = time.perf_counter()
    mask = mask.to(geo.pattern.device)  # a model split over GPUs: this layer's device
    # ``window``: a sliding-window layer's span (Gemma-3); keys outside it are never eligible
    eligible = eligible_entries(mask, cfg.causal_only, cfg.mask_first_token, window)
    shape = geo.pattern.shape
    out = {}
    ranks = {}
    tiebreak = None
    first_key = first_token(mask)
    for key, (metric, mode, rate, layers) in jobs.items():
        if layer not in layers:
            continue
        if metric is None:  # rate 1: every eligible entry
            removed = eligible.expand(shape)
            out[key] = PackedMask.pack(removed)
            _count(counts, key, mask_counts(None, eligible, removed, cfg.scope, first_key))
            continue
        if metric not in ranks:
            if metric == "random":
                scores = random_scores(shape, mask, keys, cfg.seed, layer)
            else:
                scores = metric_scores(geo, metric, cfg.kind, (gradients or {}).get(layer))
            if tiebreak is None:
                tiebreak = tiebreak_scores(shape, mask, keys, cfg.seed, layer)
            ranking = rank_entries(scores, eligible, cfg.scope, tiebreak)
            if cfg.causal_only:  # head/layer scope: the mask at query i from rows <= i (causal_scope)
                ranking = causal_ranking(ranking)
            ranks[metric] = (ranking, scores if counts is not None else None)
            del scores
        ranking, kept_scores = ranks[metric]
        removed = ranking.mask(rate, mode)
        out[key] = PackedMask.pack(removed)
        if counts is not None:
            _count(counts, key, mask_counts(kept_scores, eligible, removed, cfg.scope, first_key))
    stats.ranking_seconds += time.perf_counter() - t
    return out


def _count(counts, key, c) -> None:
    if counts is not None:
        counts[key] = counts[key] + c.cpu() if key in counts else c.cpu()


def _batch_outputs(model, units, batch, cfg, conditions, stats):
    """``{condition or None (clean): [per-unit measures]}`` for one batch.

    One streamed clean pass gives the clean scores and, layer by layer, every mask the
    conditions need; then one masked pass per distinct mask.
    """
    seqs: list[torch.Tensor] = []
    rows_of: list[list[int]] = []
    keys: list = []
    for u in batch:
        rows_of.append(list(range(len(seqs), len(seqs) + len(units[u].sequences))))
        seqs += units[u].sequences
        keys += [f"{units[u].sample_id}/{k}" for k in range(len(units[u].sequences))]
    tokens, mask = pad_batch(model, seqs)
    offsets = mask.int().argmax(-1).tolist()
    jobs, key_of = _mask_jobs(conditions, cfg)
    layers = sorted({ly for job in jobs.values() for ly in job[3]}) or [0]

    def evaluate(logits):
        return [units[u].score(logits, rows, [offsets[r] for r in rows], tokens, mask)
                for u, rows in zip(batch, rows_of, strict=True)]

    gradients = None
    if any(job[0] in GRADIENT for job in jobs.values()):
        # supervised references: a separate forward + backward pass (cwlens.gradients)
        t = time.perf_counter()
        gradients = attention_gradient(model, tokens, mask, layers)
        stats.ranking_seconds += time.perf_counter() - t
    t, ranked_before = time.perf_counter(), stats.ranking_seconds
    counts: dict = {}
    logits, per_layer = stream_geometry(
        model, tokens, lambda ly, geo: _layer_masks(geo, ly, mask, jobs, cfg, keys, stats,
                                     adapter.attention_window(model, ly), gradients, counts),
        layers=layers, attention_mask=mask,
    )
    stats.forward_seconds += time.perf_counter() - t - (stats.ranking_seconds - ranked_before)
    stats.n_forwards += 1
    packed = dict(zip(layers, per_layer, strict=True))
    results = {None: evaluate(logits)}
    done: dict = {}
    for key, (_, _, _, job_layers) in jobs.items():
        masks = {ly: packed[ly][key] for ly in job_layers}
        t = time.perf_counter()
        masked = run_masked(model, tokens, masks, cfg.renormalize, attention_mask=mask)
        stats.forward_seconds += time.perf_counter() - t
        stats.n_forwards += 1
        done[key] = evaluate(masked)
        for ly in job_layers:  # free this job's masks
            del packed[ly][key]
    zero = torch.zeros(3, dtype=torch.int64)
    for c in conditions:
        key = key_of[c]
        scored = results[None] if key is None else done[key]
        per_unit = [sum((counts[key][r] for r in rows), zero) if key is not None else zero
                    for rows in rows_of]
        results[c] = [{**out, **mask_shares(n)} for out, n in zip(scored, per_unit, strict=True)]
    return results


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


def _sweep(model, units, cfg, conditions, base, writer, stats, progress, ds_name, on_sample):
    """Every batch of the plan that has an unfinished sample: the whole batch is computed
    (so each sample gets exactly the numbers of an uninterrupted run) and the rows of its
    unfinished samples are appended, one sample at a time.

    In a torchrun job the batches left to do are dealt round-robin over the ranks
    (:func:`cwlens.distributed.shard`); rank 0's progress bar counts every rank's rows
    as they land on disk."""
    from cwlens import distributed

    batches = plan_batches(units, cfg.batch_tokens)
    todo = [b for b in batches if any(units[u].sample_id not in writer.done for u in b)]
    initial = len(writer.done & {u.sample_id for u in units})
    count = None
    if getattr(writer, "main", None) is not None:
        from cwlens.faithfulness.results import RowCounter

        counter = RowCounter(writer.main)
        count = lambda: initial + counter.new_rows() // writer.rows_per_sample  # noqa: E731
    with distributed.JobProgress(len(units), initial, f"{ds_name} ({len(conditions)} conditions)",
                                 "sample", enabled=progress, count=count) as bar:
        for batch in distributed.shard(todo):
            results = _batch_outputs(model, units, batch, cfg, conditions, stats)
            stats.n_batches += 1
            for pos, u in enumerate(batch):
                if units[u].sample_id not in writer.done:
                    writer.write_sample(_rows(base, units[u].sample_id, results, conditions, pos))
                    bar.advance(1)
                    if on_sample is not None:
                        on_sample(units[u].sample_id)


def _open_writer(out, run_config, n_rows, resume) -> ResultsWriter:
    """The results writer of this process. In a torchrun job every rank checks that all
    computed the same configuration; rank 0 opens the file first (``resume=False``
    starts it afresh; it writes the configuration and repairs its shard) and tells the
    others which samples are finished, so all ranks deal the same batches; each rank
    then appends to its own shard (:func:`~cwlens.faithfulness.results.shard_name`)."""
    from cwlens import distributed
    from cwlens.faithfulness.results import shard_name

    if not distributed.is_distributed():
        return ResultsWriter(out, run_config, n_rows, resume)
    distributed.agree(run_config, "sweep configuration")
    shard = shard_name(distributed.world().rank)
    opened: dict = {}

    def first():
        opened["writer"] = ResultsWriter(out, run_config, n_rows, resume, shard=shard)
        return sorted(opened["writer"].done)

    done = distributed.on_main(first)
    writer = opened.get("writer") or ResultsWriter(out, run_config, n_rows, True, shard=shard)
    writer.done = set(done)
    distributed.barrier()  # every shard repaired before anyone counts rows
    return writer


def _job_stats(stats: SweepStats) -> SweepStats:
    """Counts and seconds summed over the ranks of a torchrun job (wall: the longest)."""
    from cwlens import distributed

    every = distributed.gather(asdict(stats))
    total = SweepStats(**{k: sum(s[k] for s in every) for k in every[0]})
    total.wall_seconds = max(s["wall_seconds"] for s in every)
    return total


def run_faithfulness(
    model,
    dataset,
    config: FaithfulnessConfig | None = None,
    *,
    n: int | None = None,
    num_fewshot: int = 0,
    out=None,
    resume: bool = True,
    model_name: str | None = None,
    progress: bool = True,
    on_sample: Callable[[str], None] | None = None,
) -> FaithfulnessResult:
    """Run the sweep on a dataset name (``load_dataset(dataset, n, num_fewshot=...)``) or
    a list of :class:`~cwlens.datasets.TextSample` / :class:`~cwlens.datasets.ChoiceItem`.

    ``out``: a ``.jsonl`` path; rows are appended as each sample finishes and a rerun
    with the same configuration resumes (``resume=False`` starts afresh). None keeps
    the rows in memory only. ``on_sample(sample_id)`` is called after each sample.
    """
    from cwlens.datasets import ChoiceItem, load_dataset

    adapter.require_next_token_model(
        model, "The faithfulness test",
        "Use a decoder here; for an encoder, the sentence-embedding damage task is "
        "cwlens.faithfulness.encoder.embedding_damage (CLI: cwlens replicate --models <encoder>).",
    )
    cfg = config or FaithfulnessConfig()
    require_causal(cfg.scope, cfg.causal_only, "the next-token faithfulness test (ΔNLL)")
    t0 = time.perf_counter()
    samples = load_dataset(dataset, n, num_fewshot=num_fewshot) if isinstance(dataset, str) else list(dataset)
    if not samples:
        raise EmptyInputError("No samples to evaluate: pass a dataset name or a non-empty list.")
    samples = list({s.id: s for s in reversed(samples)}.values())[::-1]  # one per id, first kept
    is_choice = isinstance(samples[0], ChoiceItem)
    ds_name = samples[0].dataset + (f"_{num_fewshot}shot" if is_choice and num_fewshot else "")
    name = model_name or getattr(model.cfg, "model_name", None) or "model"
    adapter.resolve_layers(model, list(cfg.layers) if cfg.layers is not None else None)
    conditions = cfg.conditions(model.cfg.n_layers)
    per_condition = 5  # 3 measures, tied_share, first_token_share
    per_clean = 3 if is_choice else 2
    n_rows = per_clean + per_condition * len(conditions)
    units = _choice_units(model, samples) if is_choice else _text_units(model, samples, cfg.max_tokens)
    run_config = {"model": name, "dataset": ds_name, **asdict(cfg),
                  "samples": [u.sample_id for u in units]}
    base = {"model": name, "dataset": ds_name, "scope": cfg.scope, "kind": cfg.kind,
            "renormalize": cfg.renormalize, "causal_only": cfg.causal_only,
            "mask_first_token": cfg.mask_first_token, "max_tokens": cfg.max_tokens,
            "seed": cfg.seed}
    from cwlens import distributed

    distributed.require_session()
    stats = SweepStats()
    order = [units[u].sample_id for b in plan_batches(units, cfg.batch_tokens) for u in b]
    if out:
        from pathlib import Path

        from cwlens.faithfulness.results import merge_shards

        with results_lock(Path(out).parent):
            writer = _open_writer(out, run_config, n_rows, resume)
            _sweep(model, units, cfg, conditions, base, writer, stats, progress, ds_name, on_sample)
            distributed.barrier()  # every rank's rows are on disk
            if distributed.world().main:
                merge_shards(out, n_rows, order)  # one file, as a one-process run writes it
            distributed.barrier()
    else:
        writer = _MemoryWriter(n_rows)  # type: ignore[assignment]  # in a torchrun job: this rank's share; all gather below
        _sweep(model, units, cfg, conditions, base, writer, stats, progress, ds_name, on_sample)
    stats.wall_seconds = time.perf_counter() - t0
    stats = _job_stats(stats)
    if out:
        from cwlens.faithfulness.results import read_results

        table = read_results(out)
    else:
        import pandas as pd

        from cwlens.faithfulness.results import COLUMNS

        assert isinstance(writer, _MemoryWriter)
        rows = [r for part in distributed.gather(writer.rows) for r in part]
        position = {s: i for i, s in enumerate(order)}
        rows.sort(key=lambda r: position[r["sample_id"]])  # stable: a sample's rows stay in order
        table = pd.DataFrame(rows, columns=list(COLUMNS))
    return FaithfulnessResult(table, cfg, str(out) if out else None, stats)
