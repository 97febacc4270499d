"""One batch of the sweep: a streamed clean pass that ranks every layer's entries and
keeps the masks the conditions need (bit-packed), then one masked pass per distinct mask.

Conditions whose masks are provably identical share one forward pass (``reuse``): rate 0
(nothing masked = clean), rate 1 (every eligible entry, whatever the metric or mode), and
value_weighted_output_normalized with ``scope="row"`` (:func:`scored_as`).
"""

import time
from dataclasses import dataclass
from typing import NamedTuple

import torch

from cwlens.core import metrics
from cwlens.core._types import Mode
from cwlens.core.bitmask import PackedMask
from cwlens.engine import lm
from cwlens.engine.batching import pad_rows
from cwlens.engine.gradients import attention_gradient
from cwlens.engine.handle import ModelHandle
from cwlens.engine.interventions.value_masking import hooks_applied, masking_hooks
from cwlens.engine.stream_pass import StreamedPass
from cwlens.engine.streaming import (
    DEFAULT_QUERY_BLOCK,
    attention_context,
    blockwise_wanted,
    geometry_pass,
)
from cwlens.faithfulness.config import Condition, FaithfulnessConfig
from cwlens.faithfulness.job_masks import Piece, job_masks
from cwlens.faithfulness.lockstep import copies_per_pass, lockstep_pass, use_lockstep
from cwlens.faithfulness.ranking import (
    eligible_entries,
    first_token,
    mask_shares,
    metric_scores,
    random_scores,
    tiebreak_scores,
)
from cwlens.faithfulness.units import Unit
from cwlens.runs.progress import tick


@dataclass
class SweepStats:
    n_batches: int = 0
    n_forwards: int = 0  # clean (cached) + masked forward passes actually run
    forward_seconds: float = 0.0
    ranking_seconds: float = 0.0
    wall_seconds: float = 0.0


class MaskJob(NamedTuple):
    """One distinct mask of a batch: ranked by ``metric`` (None: every eligible entry,
    rate 1), removing ``rate`` of the entries in ``mode`` in each of ``layers``."""

    metric: str | None  # a name of cwlens.core.metrics.REGISTRY; None: every eligible entry
    mode: Mode
    rate: float
    layers: tuple[int, ...]


class BatchPlan(NamedTuple):
    """What ranking one layer of a batch needs besides its geometry."""

    mask: torch.Tensor  # [batch, pos] attention mask (1 on real tokens)
    jobs: dict  # job key -> MaskJob
    cfg: FaithfulnessConfig
    keys: list  # one per sequence: seeds the random control
    stats: SweepStats
    gradients: dict | None = None  # layer -> attention-gradient scores, when a job ranks by them
    counts: dict | None = None  # job key -> [batch, 3] removed / by the tie-break / on token 0


def scored_as(metric: str, cfg: FaithfulnessConfig) -> str:
    """At row scope ``||o||`` (inter: ``||o_i||``, intra: ``||o_i^h||``) is one positive
    constant per row, so value_weighted_output_normalized orders every row exactly as
    value_weighted: rank it by value_weighted, so float rounding cannot make the two
    differ (and they share their forward passes)."""
    if cfg.scope == "row" and metric == "value_weighted_output_normalized":
        return "value_weighted"
    return metric


def mask_jobs(conditions: list[Condition], cfg: FaithfulnessConfig) -> tuple[dict, dict]:
    """``(jobs, key_of)``: the distinct masks the conditions need (``key -> MaskJob``),
    and each condition's key (None: the clean pass).

    Conditions whose masks are provably identical share one key (``reuse``): rate 0 needs
    no mask (the clean pass), rate 1 removes every eligible entry whatever the metric
    (``metric=None``: no ranking), and vw-output-normalised at row scope ranks as
    value_weighted (:func:`scored_as`).
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
            jobs.setdefault(key, MaskJob(None, c.mode, c.rate, c.layers))
        else:
            ident = scored_as(c.metric, cfg) if cfg.reuse else c.metric
            key = (ident, c.mode, c.rate, c.layers)
            jobs.setdefault(key, MaskJob(scored_as(c.metric, cfg), c.mode, c.rate, c.layers))
        key_of[c] = key
    return jobs, key_of


def passes_per_batch(conditions: list[Condition], cfg: FaithfulnessConfig) -> int:
    """The forward passes :func:`batch_outputs` runs per batch: the clean one, one per
    distinct mask (:func:`mask_jobs`: conditions with provably equal masks share one, so
    24 conditions can take 21 passes), and with a gradient metric its forward + backward
    pass. What the sweep's progress bar counts (each pass ticks
    :func:`cwlens.runs.progress.tick`)."""
    jobs, _ = mask_jobs(conditions, cfg)
    gradient = any(job.metric in metrics.GRADIENT for job in jobs.values())
    return 1 + len(jobs) + int(gradient)


def sharing_note(conditions: list[Condition], cfg: FaithfulnessConfig) -> str:
    """Why a run needs fewer forward passes than it has conditions, in one line: the
    conditions that share a mask (:func:`mask_jobs`) and what each batch then runs."""
    jobs, key_of = mask_jobs(conditions, cfg)
    clean = sum(key is None for key in key_of.values())
    every = [c for c, key in key_of.items() if key is not None and key[0] == "all"]
    as_vw = [c for c, key in key_of.items() if key is not None and key[0] != "all"
             and scored_as(c.metric, cfg) != c.metric]
    why = []
    if clean:
        why.append(f"rate 0 is the clean pass ({clean} conditions)")
    if every:
        n_every = len({key_of[c] for c in every})
        why.append(f"rate 1 removes every entry, whatever the metric or mode ({len(every)} "
                   f"conditions, {n_every} mask{'s' if n_every != 1 else ''})")
    if as_vw:
        why.append(f"vwon ranks as vw at row scope, ||o_i|| being one constant per row "
                   f"({len(as_vw)} conditions)")
    n = len(conditions)
    return (f"{n} condition{'s' if n != 1 else ''} per sample, {len(jobs)} distinct "
            f"mask{'s' if len(jobs) != 1 else ''}" + (f" ({'; '.join(why)})" if why else "")
            + f"; each batch runs 1 clean pass + 1 per mask = {1 + len(jobs)} forward passes")


def layer_masks(geo, layer: int, plan: BatchPlan, window: int | None = None) -> dict:
    """Rank one layer's entries by every metric some job needs; ``{job key: PackedMask}``.

    Runs inside the clean forward pass (:func:`cwlens.stream_geometry`), so only one
    layer's scores and ranks exist at a time; the masks are kept bit-packed. ``window``:
    a sliding-window layer's span (Gemma-3); keys outside it are never eligible. Ties are
    broken by the seeded random order of :func:`~cwlens.faithfulness.ranking.tiebreak_scores`;
    ``plan.counts[job key]`` (``[batch, 3]``: removed, chosen by the tie-break, on the first
    token) is summed over the layers where given.
    """
    t = time.perf_counter()
    cfg = plan.cfg
    mask = plan.mask.to(geo.pattern.device)  # a model split over GPUs: this layer's device
    eligible = eligible_entries(mask, cfg.causal_only, cfg.mask_first_token, window)
    shape = geo.pattern.shape

    def scores_of(metric: str) -> torch.Tensor:
        if metric == "random":
            return random_scores(shape, mask, plan.keys, cfg.seed, layer)
        return metric_scores(geo, metric, cfg.kind, (plan.gradients or {}).get(layer))

    jobs = [(key, MaskJob(*job)) for key, job in plan.jobs.items()]  # plain tuples work too
    here = [(key, job) for key, job in jobs if layer in job.layers]
    piece = Piece(shape, eligible, first_token(mask), scores_of,
                  lambda: tiebreak_scores(shape, mask, plan.keys, cfg.seed, layer))
    out = {key: PackedMask.pack(removed) for key, removed in job_masks(
        here, piece, cfg.scope, plan.counts, causal=cfg.causal_only)}  # head/layer: rows <= i
    plan.stats.ranking_seconds += time.perf_counter() - t
    return out


def _layer_masks(geo, layer, mask, jobs, cfg, keys, stats, window=None) -> dict:
    """:func:`layer_masks` of a batch without gradient metrics, its plan spelled out."""
    return layer_masks(geo, layer, BatchPlan(mask, jobs, cfg, keys, stats), window)


def _batch_objective(units, batch, rows_of, offsets):
    """The gradient metrics' loss of a batch: the sum of its units' objectives (multiple
    choice: each item's label margin), or None (every unit a document: the next-token
    loss, :func:`cwlens.engine.gradients.document_loss`)."""
    if all(units[u].objective is None for u in batch):
        return None
    if any(units[u].objective is None for u in batch):
        raise ValueError("a batch mixes documents and multiple-choice items")

    def loss(logits):
        return sum(units[u].objective(logits, rows, [offsets[r] for r in rows])
                   for u, rows in zip(batch, rows_of, strict=True))

    return loss


def batch_outputs(handle: ModelHandle, units: list[Unit], batch: list[int], cfg: FaithfulnessConfig,
                  conditions: list[Condition], stats: SweepStats) -> dict:
    """``{condition or None (clean): [per-unit measures]}`` for one batch.

    One streamed clean pass gives the clean scores and, layer by layer, every mask the
    conditions need; then one masked pass per distinct mask. Above
    :data:`cwlens.engine.lm.CHUNKED_ABOVE` positions, and for multiple-choice units, no
    pass makes logits: the units score the final residual chunk by chunk, or at their
    continuation positions only (:class:`~cwlens.engine.lm.Unembedded`).
    """
    seqs: list = []
    rows_of: list[list[int]] = []
    keys: list = []
    for u in batch:
        rows_of.append(list(range(len(seqs), len(seqs) + len(units[u].sequences))))
        seqs += units[u].sequences
        keys += [f"{units[u].sample_id}/{k}" for k in range(len(units[u].sequences))]
    tokens, mask = (t.to(handle.device) for t in pad_rows(seqs, handle.pad_id, handle.padding_side))
    offsets = mask.int().argmax(-1).tolist()
    jobs, key_of = mask_jobs(conditions, cfg)
    layers = sorted({ly for job in jobs.values() for ly in job.layers}) or [0]

    # long inputs, and multiple choice (a few continuation positions are read): no
    # [batch, pos, vocab] logits. Gemma-3's 262k vocabulary made them most of a pass.
    few = all(units[u].positions is not None for u in batch)
    chunk = lm.CHUNK if few else lm.chunk_for(tokens.shape[1])

    def evaluate(output):
        if few and isinstance(output, lm.Unembedded):  # the positions read, in one product
            pairs = []
            for u, rows in zip(batch, rows_of, strict=True):
                read = units[u].positions
                assert read is not None  # few: every unit says what it reads
                pairs += read(rows, [offsets[r] for r in rows])
            output = lm.Picked.of(output, pairs)
        return [units[u].score(output, rows, [offsets[r] for r in rows], tokens, mask)
                for u, rows in zip(batch, rows_of, strict=True)]

    blockwise = blockwise_wanted("auto", handle.supports_blockwise, lambda: int(tokens.shape[-1]))
    if use_lockstep(blockwise, cfg, [job.metric for job in jobs.values()]):
        return _finish(lockstep_outputs(handle, tokens, BatchPlan(mask, jobs, cfg, keys, stats, None, {}),
                                        evaluate, chunk), conditions, key_of, rows_of)
    gradients = None
    if any(job.metric in metrics.GRADIENT for job in jobs.values()):
        # supervised references: a separate forward + backward pass (cwlens.engine.gradients)
        t = time.perf_counter()
        gradients = attention_gradient(handle, tokens, mask, layers,
                                       loss=_batch_objective(units, batch, rows_of, offsets))
        stats.ranking_seconds += time.perf_counter() - t
        tick()
    counts: dict = {}
    plan = BatchPlan(mask, jobs, cfg, keys, stats, gradients, counts)
    t, ranked_before = time.perf_counter(), stats.ranking_seconds
    windows = {ly: handle.attention_window(ly) for ly in layers}
    with lm.deferred_logits(handle, chunk) as output:
        logits, per_layer = geometry_pass(  # the units' own tokens, layers from the config
            StreamedPass(handle, layers, mask, False), tokens,
            lambda ly, geo: layer_masks(geo, ly, plan, windows[ly]))
    stats.forward_seconds += time.perf_counter() - t - (stats.ranking_seconds - ranked_before)
    stats.n_forwards += 1
    tick()
    packed = dict(zip(layers, per_layer, strict=True))
    clean = evaluate(output(logits))
    done: dict = {}
    for key, job in jobs.items():
        masks = {ly: packed[ly][key] for ly in job.layers}
        t = time.perf_counter()
        # the self-check of the edits (hooks_applied, once per model) runs before the
        # unembedding is skipped (deferred_logits): entered left to right
        with torch.no_grad(), hooks_applied(handle, masking_hooks(masks, cfg.renormalize)), \
                attention_context(handle, tokens, "auto"), lm.deferred_logits(handle, chunk) as output:
            masked = output(handle(tokens, attention_mask=mask))
        stats.forward_seconds += time.perf_counter() - t
        stats.n_forwards += 1
        tick()
        done[key] = evaluate(masked)
        for ly in job.layers:  # free this job's masks
            del packed[ly][key]
    return _finish((clean, done, counts), conditions, key_of, rows_of)


def lockstep_outputs(handle: ModelHandle, tokens: torch.Tensor, plan: BatchPlan, evaluate, chunk: int | None
                     ) -> tuple[list, dict, dict | None]:
    """``(clean scores, {job key: scores}, counts)`` of a batch on the lockstep path
    (:mod:`cwlens.faithfulness.lockstep`): the jobs in passes of
    :func:`~cwlens.faithfulness.lockstep.copies_per_pass` masked copies beside the clean one."""
    b, n = tokens.shape
    per_pass = copies_per_pass(b, handle.n_heads, n, DEFAULT_QUERY_BLOCK)
    items = list(plan.jobs.items())
    clean: list = []
    done: dict = {}
    for at in range(0, max(len(items), 1), per_pass):
        group = items[at : at + per_pass]
        t = time.perf_counter()
        ranked_before = plan.stats.ranking_seconds
        output = lockstep_pass(handle, tokens, plan, group, chunk)
        plan.stats.forward_seconds += time.perf_counter() - t - (plan.stats.ranking_seconds - ranked_before)
        plan.stats.n_forwards += 1 + len(group)
        tick(len(group) + (0 if at else 1))  # the clean copy counts once, as in passes_per_batch
        if not at:
            clean = evaluate(lm.rows(output, 0, b))
        for j, (key, _) in enumerate(group):
            done[key] = evaluate(lm.rows(output, b * (j + 1), b * (j + 2)))
        del output
    return clean, done, plan.counts


def _finish(outputs: tuple[list, dict, dict | None], conditions, key_of, rows_of) -> dict:
    """``{condition or None: [per-unit measures with the mask shares]}``."""
    clean, done, counts = outputs
    counts = counts or {}
    results: dict = {None: clean}
    zero = torch.zeros(3, dtype=torch.int64)
    for c in conditions:
        key = key_of[c]
        scored = results[None] if key is None else done[key]
        per_unit = [sum((counts[key][r] for r in rows), zero) if key is not None else zero
                    for rows in rows_of]
        results[c] = [{**out, **mask_shares(n)} for out, n in zip(scored, per_unit, strict=True)]
    return results
