"""How much an agreement figure moves when the prompts change: the noise of
:func:`cwlens.circuits.compare_with_patching` at ``n`` prompts.

Every score of a head (and its patching effect) is a mean over prompts, so the Spearman
correlation and the top-k overlap of :class:`~cwlens.circuits.results.Agreement` are
statistics of the prompt sample. :func:`prompt_scores` computes each score and the
patching effect **per prompt** on a pool of ``N`` prompts; :func:`agreement_noise`
splits the pool, many times over, into two disjoint sets of ``n`` prompts, recomputes the
agreement on each from their means, and reports how far two such runs fall apart: the
standard deviation of one run's value (from their differences, so the finite pool does
not shrink it) and the 2.5-97.5% range.

:data:`MEASURED_SD` holds that spread as measured on SmolLM2-135M
(``scripts/circuits_noise.py``; docs/circuits.md, "How many prompts"), and
:data:`MIN_PROMPTS` the fewest prompts at which it is at most :data:`NOISE_SD`.
:meth:`~cwlens.circuits.Comparison.format` (what ``cwlens circuits`` prints) ends with
what the figures can tell at its number of prompts (:func:`noise_note`), and with a
warning below :data:`MIN_PROMPTS`.
"""

from collections.abc import Sequence

import torch

from cwlens.circuits.direct import direct_logit_attribution
from cwlens.circuits.heads import head_scores
from cwlens.circuits.patching import patch_effects
from cwlens.circuits.results import HeadScores, agreement
from cwlens.engine import validation
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.measures import run_with_cache
from cwlens.errors import InvalidArgumentError

#: The spread measured on SmolLM2-135M (``scripts/circuits_noise.py``; docs/circuits.md,
#: "How many prompts"): per task and prompts per run ``n``, one standard deviation of a
#: score's all-heads Spearman with patching between two runs on different prompts, the
#: largest of the four scores. Capitals runs its fixed list of countries: no entry.
MEASURED_SD = {
    "ioi": {2: 0.082, 4: 0.068, 8: 0.057, 16: 0.054, 24: 0.054},
    "induction": {2: 0.057, 4: 0.047, 8: 0.042, 16: 0.035},
}
#: The spread (one SD of the all-heads Spearman) at which two scores 0.17 apart
#: (``2 sqrt(2) SD``) are ordered and a value 0.12 from 0 shows agreement.
NOISE_SD = 0.06
#: Fewest prompts whose measured spread is at most :data:`NOISE_SD`, per task.
MIN_PROMPTS = {task: min((n for n, sd in table.items() if sd <= NOISE_SD), default=max(table) + 1)
               for task, table in MEASURED_SD.items()}


def spread(task: str, n_prompts: int) -> float | None:
    """The measured spread (:data:`MEASURED_SD`) for ``n_prompts``: that of the largest
    measured ``n`` at or below it (the smallest measured one below them all: a lower
    bound); None for a task without measurements."""
    table = MEASURED_SD.get(task)
    if not table:
        return None
    below = [n for n in table if n <= n_prompts]
    return table[max(below)] if below else table[min(table)]


@takes_model
def prompt_scores(model: ModelLike, task, mode: str = "corrupt") -> dict[str, torch.Tensor]:
    """``{score: [prompt, layer, head]}`` for every score of
    :func:`~cwlens.circuits.compare_with_patching` and ``"patching"``, one prompt at a
    time (their means over the prompts are that function's scores; tested)."""
    rows: dict[str, list[torch.Tensor]] = {}
    for i in range(task.n_prompts):
        one = task.subset([i])
        with torch.no_grad():  # what compare_with_patching runs (circuit_cache)
            logits, cache = run_with_cache(model, one.clean, residual=True)
        scores = dict(head_scores(cache, model, one.queries, one.keys))
        scores["direct_logit"] = direct_logit_attribution(
            cache, model, logits, one.queries, one.answers, one.foils).head_scores()
        del cache
        for name, s in scores.items():
            rows.setdefault(name, []).append(s.values)
    out = {name: torch.stack(v) for name, v in rows.items()}
    if mode == "mean":
        raise InvalidArgumentError("mode='mean' ablates to the batch mean, so a prompt's effect "
                                   "depends on the others: per-prompt noise needs mode='corrupt'.")
    out["patching"] = patch_effects(model, task.clean, task.metric, task.corrupted, mode)
    return out


def agreement_noise(per_prompt: dict[str, torch.Tensor], sizes: Sequence[int], draws: int = 200,
                    k: int = 10, seed: int = 0):
    """How far the agreement with ``per_prompt["patching"]`` of every other score moves
    between two independent sets of ``n`` prompts, for each ``n`` of ``sizes``.

    Each of ``draws`` draws splits a random permutation of the pool into two disjoint
    sets of ``n`` prompts (``2 n`` at most the pool) and recomputes every agreement on
    each from their means: what two runs with different ``--seed`` would print. Returns a
    DataFrame, one row per ``(score, n, statistic)`` (statistics: ``spearman``,
    ``spearman_top``, ``top_k_overlap``): ``mean`` of a set's value, ``sd`` (its standard
    deviation, estimated as SD(first - second) / sqrt 2, which disjoint sets give without
    the finite-pool shrinkage of redrawing from one pool), ``apart`` (the mean |first -
    second|), ``low`` / ``high`` (2.5% and 97.5% quantiles of a set's value) and ``pool``
    (the value on all the pool's prompts)."""
    import pandas as pd  # heavy: pandas, imported on use

    if "patching" not in per_prompt:
        raise InvalidArgumentError("per_prompt needs a 'patching' entry (prompt_scores gives one).")
    n_pool = int(per_prompt["patching"].shape[0])
    validation.positive_int(draws, "draws")
    for n in sizes:
        validation.positive_int(n, "each of sizes")
        if 2 * n > n_pool:
            raise InvalidArgumentError(f"sizes lists {n} prompts: two disjoint sets of {n} need "
                                       f"{2 * n}, the pool has {n_pool}.")
    g = torch.Generator().manual_seed(seed)
    stats = ("spearman", "spearman_top", "top_k_overlap")

    def values(rows) -> dict[str, dict[str, float]]:
        ref = HeadScores("patching", per_prompt["patching"][rows].mean(0))
        return {name: {s: getattr(a, s) for s in stats}
                for name, x in per_prompt.items() if name != "patching"
                for a in [agreement(HeadScores(name, x[rows].mean(0)), ref, k)]}

    pool = values(torch.arange(n_pool))
    out = []
    for n in sizes:
        pairs = []
        for _ in range(draws):
            order = torch.randperm(n_pool, generator=g)
            pairs.append((values(order[:n]), values(order[n : 2 * n])))
        for name in pool:
            for s in stats:
                v = torch.tensor([[a[name][s], b[name][s]] for a, b in pairs], dtype=torch.float64)
                v = v[~v.isnan().any(1)]
                diff = v[:, 0] - v[:, 1]
                out.append(dict(score=name, n=n, statistic=s, mean=float(v.mean()),
                                sd=float(diff.std() / 2 ** 0.5), apart=float(diff.abs().mean()),
                                low=float(v.flatten().quantile(0.025)),
                                high=float(v.flatten().quantile(0.975)), pool=pool[name][s],
                                n_pool=n_pool, draws=len(v)))
    return pd.DataFrame(out)


def min_prompts(noise, statistic: str = "spearman", sd: float = NOISE_SD) -> int | None:
    """The smallest ``n`` of :func:`agreement_noise`'s table at which every score's
    ``statistic`` has a standard deviation of at most ``sd`` (None: no ``n`` of the table)."""
    rows = noise[noise["statistic"] == statistic]
    worst = rows.groupby("n")["sd"].max()
    ok = worst[worst <= sd]
    return int(ok.index.min()) if len(ok) else None


def noise_note(task: str, n_prompts: int) -> str:
    """What the agreement figures of a comparison on ``n_prompts`` prompts of ``task``
    can say, from :data:`MEASURED_SD`; a warning first below :data:`MIN_PROMPTS`. ``""``
    for a task without measurements (capitals)."""
    sd = spread(task, n_prompts)
    if sd is None:
        return ""
    at_least = "at least " if n_prompts < min(MEASURED_SD[task]) else ""
    some = f"{n_prompts} prompt" + ("s" if n_prompts != 1 else "")
    note = (f"noise: with {some} a score's all-heads Spearman moves by {at_least}"
            f"±{sd:.2f} (1 SD) between runs on other prompts, the top-k figures by more: a value "
            f"within ±{2 * sd:.2f} of 0 shows no agreement, and two scores less than "
            f"{2 * 2 ** 0.5 * sd:.2f} apart are not ordered (measured on SmolLM2-135M: "
            "docs/circuits.md, 'How many prompts')")
    need = MIN_PROMPTS[task]
    if n_prompts < need:
        note = (f"warning: {some} {'are' if n_prompts != 1 else 'is'} too few for these agreement figures: below "
                f"{need} prompts they move by more than ±{NOISE_SD} (1 SD); use --prompts {need} "
                "or more.\n" + note)
    return note
