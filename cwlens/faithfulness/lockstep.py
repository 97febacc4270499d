"""Row-scope masks ranked per query block, in one forward pass with the clean stream.

At row scope (``scope="row"``, the default) every query row of every head is its own
ranking unit, so a row's mask needs only that row's clean scores. The *lockstep* path
runs the clean batch and ``k`` masked copies of it as one batch of ``(1 + k) b`` rows
(copy 0 clean, copy ``1 + j`` masked by job ``j``). At each layer and each query block
(blockwise attention, :mod:`cwlens.engine.models.blockwise`) the ``hook_pattern`` of the
layer gets the block's probabilities ``[(1 + k) b, head, rows, key_stop]``:

1. the clean copy's rows give the block's geometry (the clean ``hook_v`` and
   ``hook_resid_pre`` of this layer, caught just before) and each needed metric's scores;
2. each row is ranked there by the rule of :func:`~cwlens.faithfulness.ranking.rank_entries`
   (the tie-break and the ``random`` control are counter-based hashes of the entry's
   position, :func:`~cwlens.faithfulness.ranking.uniforms_at`, so a block draws exactly
   the whole layer's values), in sub-blocks of at most :data:`RANK_ENTRIES` entries;
3. job ``j``'s mask of those rows removes entries from copy ``1 + j``'s rows before the
   value product (:func:`~cwlens.engine.interventions.value_masking.remove_entries`),
   then everything of the block is freed.

The masks and the masked passes are those of the whole-layer path
(:func:`cwlens.faithfulness.passes.layer_masks` + one ``run_masked`` per mask), but no
``[batch, head, n, n]`` tensor and no packed mask of a layer exists: memory beyond the
forward is a few ``[batch, head, block, n]`` tensors per pass. Gradient metrics need the
clean backward's ``[head, n, n]`` scores and are refused here; head and layer scopes rank
across rows and keep the whole-layer path. :func:`use_lockstep` is the rule that picks
the path (``FaithfulnessConfig.ranking_path``).
"""

import time
from collections.abc import Sequence

import torch

from cwlens.core import metrics
from cwlens.core.bitmask import PackedMask
from cwlens.engine import adapter, hook_names, lm
from cwlens.engine.handle import ModelHandle
from cwlens.engine.interventions.selfcheck import ensure_edits_act
from cwlens.engine.interventions.value_masking import remove_entries
from cwlens.engine.models import blockwise
from cwlens.engine.streaming import attention_context
from cwlens.errors import CwlensError, InvalidArgumentError
from cwlens.faithfulness.job_masks import Piece, job_masks
from cwlens.faithfulness.ranking import (
    RowBlock,
    eligible_rows,
    first_token,
    metric_scores,
    random_scores,
    tiebreak_scores,
)

RANK_ENTRIES = 2**22  # entries ranked at once (~65 bytes each while sorting)
COPY_BYTES = 2**30  # one query block's probabilities over every copy of a pass


def use_lockstep(blockwise: bool, cfg, job_metrics: Sequence[str | None]) -> bool:
    """Whether a batch runs on the lockstep path; ``blockwise``: whether the batch's
    forward runs blockwise under ``attention="auto"``
    (:func:`cwlens.engine.streaming.blockwise_wanted`).

    ``cfg.ranking_path``: ``"whole_layer"`` never; ``"lockstep"`` always (refused for
    head/layer scopes and gradient metrics, with the fix); ``"auto"``: where attention
    runs blockwise (:func:`cwlens.engine.streaming.use_blockwise`, above
    :data:`cwlens.engine.streaming.AUTO_THRESHOLD` tokens) at row scope and no job ranks by a
    gradient metric -- exactly where the whole-layer ranking would hold ``[batch, head, n,
    n]`` tensors that blockwise attention avoids."""
    path = cfg.ranking_path
    gradient = sorted({m for m in job_metrics if m in metrics.GRADIENT})
    if path == "whole_layer":
        return False
    if path == "lockstep":
        if cfg.scope != "row":
            raise InvalidArgumentError(
                f"ranking_path='lockstep' ranks each query row alone, so it needs scope='row'; "
                f"got scope={cfg.scope!r}, whose units span rows. Use ranking_path='auto' "
                "(the whole-layer ranking) for head or layer scope (CLI: --ranking-path auto, "
                "or --scope row).")
        if gradient:
            raise InvalidArgumentError(
                f"ranking_path='lockstep' cannot rank by {', '.join(gradient)}: gradient metrics "
                "need the clean backward pass's [head, n, n] scores of every layer. Drop them "
                "from metrics, or use ranking_path='whole_layer' (memory grows as layers x n^2; "
                "CLI: --ranking-path whole_layer).")
        return True
    return cfg.scope == "row" and not gradient and blockwise


def copies_per_pass(batch: int, n_heads: int, n: int, query_block: int) -> int:
    """Masked copies per lockstep pass: one block's float32 probabilities over all copies
    within :data:`COPY_BYTES` (at least one)."""
    per_copy = batch * n_heads * min(n, query_block) * n * 4
    return max(1, COPY_BYTES // max(per_copy, 1) - 1)


class _Lockstep:
    """The hooks of one lockstep pass: catch the clean ``hook_v`` / ``hook_resid_pre`` of
    each masked layer, then rank and mask each block at ``hook_pattern``."""

    def __init__(self, handle: ModelHandle, plan, jobs: list, batch: int):
        self.handle, self.plan, self.jobs, self.b = handle, plan, jobs, batch
        self.caught: dict[int, dict] = {}
        self.mask = plan.mask.bool()

    def hooks(self) -> list:
        layers = sorted({ly for _, job in self.jobs for ly in job.layers})
        out: list = []
        for ly in layers:
            out.append((hook_names.values(ly), self._catch(ly, "v")))
            if self.handle.has_hook(hook_names.resid_pre(ly)):
                out.append((hook_names.resid_pre(ly), self._catch(ly, "residual")))
            out.append((hook_names.pattern(ly), self._pattern(ly)))
        return out

    def _catch(self, layer: int, what: str):
        def catch(tensor: torch.Tensor, hook) -> None:
            self.caught.setdefault(layer, {})[what] = tensor.detach()[: self.b]
            return None

        return catch

    def _pattern(self, layer: int):
        def mask_block(pattern: torch.Tensor, hook) -> torch.Tensor:
            block = blockwise.current_block()
            n_keys = pattern.shape[-1] if block is None else block.n_keys
            start = 0 if block is None else block.query_start
            caught = self.caught.get(layer, {})
            if "v" not in caught:
                raise CwlensError(
                    f"Layer {layer}: hook_pattern fired before {hook_names.values(layer)!r}; "
                    "this model's attention cannot run the lockstep ranking: use "
                    "ranking_path='whole_layer'.")
            t = time.perf_counter()
            masks = self._block_masks(layer, pattern[: self.b].detach(), start, n_keys)
            pieces = [pattern[: self.b]]
            for j, (key, _) in enumerate(self.jobs):
                rows = pattern[self.b * (j + 1) : self.b * (j + 2)]
                pieces.append(rows if key not in masks else remove_entries(
                    rows, ~masks[key], self.plan.cfg.renormalize))
            del masks
            if block is None or block.last:
                del self.caught[layer]
            self.plan.stats.ranking_seconds += time.perf_counter() - t
            return torch.cat(pieces)

        mask_block.cwlens_blockwise = True  # type: ignore[attr-defined]  # takes query blocks
        return mask_block

    def _geometry(self, layer: int, clean: torch.Tensor, start: int, n_keys: int):
        caught = self.caught[layer]
        if "base" not in caught:  # the layer's key side (values, norms), once
            b, h = clean.shape[:2]
            caught["base"] = adapter.layer_geometry(self.handle, layer, clean.new_zeros(b, h, 1, n_keys),
                                                    caught["v"], self.mask, caught.get("residual"))
        return caught["base"].with_rows(clean, start)

    def _block_masks(self, layer: int, clean: torch.Tensor, start: int, n_keys: int) -> dict:
        """``{job key: bool [b, head, rows, key_stop]}`` for the jobs masking ``layer``."""
        cfg, plan = self.plan.cfg, self.plan
        here = [(key, job) for key, job in self.jobs if layer in job.layers]
        if not here:
            return {}
        b, h, n_rows, key_stop = clean.shape
        if not cfg.causal_only and key_stop < n_keys:  # keys after the block count too (a = 0)
            clean = torch.nn.functional.pad(clean, (0, n_keys - key_stop))
        width = clean.shape[-1]
        mask = self.mask.to(clean.device)  # a model split over GPUs: this layer's device
        geo = self._geometry(layer, clean, start, n_keys)
        window = self.handle.attention_window(layer)
        wanted = list(dict.fromkeys(job.metric for _, job in here if job.metric not in (None, "random")))
        scores = {m: metric_scores(geo, m, cfg.kind) for m in wanted}
        del geo
        out = {key: torch.zeros(b, h, n_rows, width, dtype=torch.bool, device=clean.device) for key, _ in here}
        step = max(1, RANK_ENTRIES // (b * h * width))
        first_key = first_token(mask)[..., :width]
        for a in range(0, n_rows, step):
            rows = RowBlock(start + a, min(step, n_rows - a), width)
            shape = (b, h, rows.n_rows, width)
            elig = eligible_rows(mask, rows, cfg.causal_only, cfg.mask_first_token, window)
            piece = (slice(None), slice(None), slice(a, a + rows.n_rows))

            def scores_of(metric: str, rows=rows, piece=piece, shape=shape) -> torch.Tensor:
                if metric == "random":
                    return random_scores(shape, mask, plan.keys, cfg.seed, layer, rows.query_start)
                return scores[metric][piece]

            def tiebreak_of(rows=rows, shape=shape) -> torch.Tensor:
                return tiebreak_scores(shape, mask, plan.keys, cfg.seed, layer, rows.query_start)

            for key, removed in job_masks(here, Piece(shape, elig, first_key, scores_of, tiebreak_of),
                                          "row", plan.counts):
                out[key][piece] = removed.unpack() if isinstance(removed, PackedMask) else removed
            del elig
        return {key: m[..., :key_stop] for key, m in out.items()}


def lockstep_pass(handle: ModelHandle, tokens: torch.Tensor, plan, jobs: list, chunk: int | None
                  ) -> "lm.LMOutput":
    """One forward of the clean batch and one masked copy per job of ``jobs`` (``[(key,
    MaskJob)]``); returns the output of all ``(1 + len(jobs)) b`` rows (copy ``c``: rows
    ``c b .. (c + 1) b - 1``; copy 0 is clean)."""
    b = tokens.shape[0]
    copies = 1 + len(jobs)
    big_tokens, big_mask = tokens.repeat(copies, 1), plan.mask.repeat(copies, 1)
    taps = _Lockstep(handle, plan, jobs, b)
    ensure_edits_act(handle, {"pattern"})
    with torch.no_grad(), attention_context(handle, big_tokens, "auto"), \
            lm.deferred_logits(handle, chunk) as output, handle.hooks(taps.hooks()):
        logits = handle(big_tokens, attention_mask=big_mask)
    return output(logits)
