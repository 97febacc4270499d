"""Contribution and attention head scores set against activation patching on one task.

:func:`compare_with_patching` runs the clean prompts once with a cache, scores every head
(:func:`cwlens.circuits.head_scores`, :func:`cwlens.circuits.direct_logit_attribution`),
patches every head's ``hook_z`` (:func:`cwlens.circuits.patch_heads`), and reports for
each score its Spearman correlation and top-k overlap with the patching effect over all
heads.
"""

from dataclasses import dataclass, field

import torch

from cwlens.circuits.direct import DirectLogitAttribution, direct_logit_attribution
from cwlens.circuits.heads import head_scores
from cwlens.circuits.noise import noise_note
from cwlens.circuits.patching import MODES, patch_heads
from cwlens.circuits.results import Agreement, HeadScores, agreement
from cwlens.circuits.tasks import CircuitTask
from cwlens.engine import validation
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.measures import run_with_cache
from cwlens.errors import InvalidArgumentError, UnknownOptionError
from cwlens.runs.progress import tick


@dataclass(frozen=True)
class Comparison:
    """Scores of every head on one task, and their agreement with patching."""

    task: CircuitTask
    scores: dict = field(repr=False)  # name -> HeadScores (patching included)
    agreements: tuple[Agreement, ...]
    dla: DirectLogitAttribution = field(repr=False)
    clean_metric: float
    corrupted_metric: float

    @property
    def patching(self) -> HeadScores:
        return self.scores["patching"]

    def to_dataframe(self):
        """One row per head: ``layer, head, label`` and one column per score."""
        frames = [s.to_dataframe() for s in self.scores.values()]
        out = frames[0]
        for f in frames[1:]:
            out = out.merge(f, on=["layer", "head", "label"])
        return out

    def agreement_dataframe(self):
        import pandas as pd  # heavy: pandas, imported on use

        return pd.DataFrame([a.as_dict() for a in self.agreements])

    def format(self, top: int = 10) -> str:
        """The text the CLI prints: rankings side by side, then the agreement table."""
        validation.positive_int(top, "top")
        names = list(self.scores)
        tops = {n: self.scores[n].top(top) for n in names}
        top = min(top, max(len(t) for t in tops.values()))  # no empty numbered rows past the heads
        width = 22
        lines = [f"task {self.task.name}: {self.task.description}",
                 f"  {self.task.clean.shape[0]} prompts x {len(self.task.queries)} queries; "
                 f"metric clean {self.clean_metric:+.3f}, corrupted {self.corrupted_metric:+.3f}; "
                 f"key = {self.task.key_description}",
                 f"  direct logit attribution completeness error {self.dla.completeness_error:.1e} "
                 "(frozen final-norm scale)",
                 "", f"top {top} heads by each score:",
                 "  rank " + "".join(f"{n[:width]:<{width}}" for n in names)]
        for r in range(top):
            cells = "".join(f"{tops[n][r][0]:>6} {tops[n][r][1]:+.4f}".ljust(width) if r < len(tops[n]) else " " * width for n in names)
            lines.append(f"  {r + 1:>4} " + cells)
        lines.append("  (each cell: head as L<layer>H<head>, its score; " + "; ".join(
            f"{n} = {self.scores[n].description or n}" for n in names) + ")")
        lines += ["", f"agreement with patching over {self.agreements[0].n_heads} heads:",
                  f"  {'score':<22}{'Spearman':>10}{'Spearman top':>14}{'top-' + str(self.agreements[0].k) + ' overlap':>16}",
                  f"  {'':<22}{'(all)':>10}{'(top-k union)':>14}"]
        for a in self.agreements:
            lines.append(f"  {a.score:<22}{a.spearman:>+10.2f}{a.spearman_top:>+14.2f}{a.top_k_overlap:>16.2f}")
        k = self.agreements[0].k
        lines.append(f"  (Spearman (all): rank correlation with patching over every head; (top-k "
                     f"union): over the heads in either top {k}; top-{k} overlap: the share of "
                     f"patching's top {k} heads in the score's top {k})")

        note = noise_note(self.task.name, self.task.n_prompts)
        if note:
            lines += ["", note]
        return "\n".join(lines)


def circuit_cache(model, tokens: torch.Tensor):
    """``(logits, cache)`` with what :mod:`cwlens.circuits` needs, without gradients
    (:func:`cwlens.run_with_cache` with ``residual=True``); public as
    ``cwlens.circuits.run_with_cache``."""
    with torch.no_grad():
        return run_with_cache(model, tokens, residual=True)


@takes_model
def compare_with_patching(model: ModelLike, task: CircuitTask, k: int = 10, mode: str = "corrupt") -> Comparison:
    """Score every head of ``model`` on ``task`` and compare with activation patching.

    ``k``: the top-k of the overlap (a positive int below the number of heads: at or above
    it every ranking's top k is every head and the overlap is 1 by construction);
    ``mode``: ``"corrupt"`` or ``"mean"`` (:func:`cwlens.circuits.patch_heads`).
    """
    if not isinstance(task, CircuitTask):
        raise InvalidArgumentError(f"task must be a CircuitTask (cwlens.circuits.build_task(name, "
                                   f"model)); got {type(task).__name__}.")
    validation.positive_int(k, "k")
    if mode not in MODES:
        raise UnknownOptionError(f"Unknown patching mode={mode!r}. Valid modes: 'corrupt', 'mean'.")
    heads = model.n_layers * model.n_heads
    if k >= heads:
        raise InvalidArgumentError(
            f"k = {k} covers all {heads} heads of this model: every ranking's top {k} is every "
            f"head, so the overlap would be 1 by construction; pass k below {heads} (--k).")
    logits, cache = circuit_cache(model, task.clean)
    batch = task.clean.shape[0]
    # progress in sequences run (cwlens.runs.progress): the batch 4 times, then n_heads x
    # batch per layer (patch_heads), so that the time left follows the work
    tick(batch)
    scores: dict[str, HeadScores] = dict(head_scores(cache, model, task.queries, task.keys))
    dla = direct_logit_attribution(cache, model, logits, task.queries, task.answers, task.foils)
    scores["direct_logit"] = dla.head_scores()
    del cache
    with torch.no_grad():
        clean_metric = float(task.metric(logits).mean())
        corrupted_metric = float(task.metric(model(task.corrupted)).mean())
    tick(batch)
    scores["patching"] = patch_heads(model, task.clean, task.metric, task.corrupted, mode=mode)
    agreements = tuple(
        agreement(s, scores["patching"], k) for name, s in scores.items() if name != "patching"
    )
    return Comparison(task, scores, agreements, dla, clean_metric, corrupted_metric)
