"""Scores against the ground truth: per input, then per program and method with intervals.

**Per input** (:func:`score_input`), each method's scores are set against the truth of
its level (:mod:`cwlens.groundtruth.methods`), over the entries the truth speaks about:

``layer`` vs *movement* (b)
    every ``(layer, head, query, key)`` with ``query >= 1`` (BOS is not an output) and a key
    the query can see (all keys in a bidirectional model, ``key <= query`` in a causal one),
    in rows whose query did **not** fall back to BOS. A fall-back row moved nothing (the
    BOS's value is zero), so every entry of it is a negative: such rows are scored
    separately, as the scope ``"with_fallback"`` (the same entries plus the fall-back rows).
``input`` vs *dependence* (a)
    every ``(output position q >= 1, input position k >= 1)`` (the BOS cannot be changed,
    so no output depends on it), keys visible as above.
``component`` vs the compiled graph's *components* (c)
    every attention head ``(layer, head)``; positives are the heads in
    ``program.components`` (MLPs are in the truth but no head score scores them).

tracr's padding heads (all-zero weights, :mod:`cwlens.groundtruth.padding`) are left out
of the ``layer`` and ``component`` entries (``heads`` of :func:`score_input`): they are the
compiler's layout, not the program, and would be free negatives (every head that is not
padding is a component, so the ``component`` level has no negative left in a compiled
program).

Entries where any method of the level has no score (NaN: a measure undefined there) are
left out for every method of that level, and counted (``n_undefined``). Scores are ranked
at a resolution of 1e-4 of the input's largest ``|score|`` (:func:`resolution`): closer
scores are ties, so the compiled softmax's leak (~1e-6 of an attention row) orders nothing.

The per-input numbers are the ROC AUC and the precision at ``|truth|``
(:mod:`cwlens.core.ranking_scores`); an input whose truth has no positive or no negative
among the entries has no AUC (NaN) and is left out of that level's means (the same
inputs for every method of the level, so the comparisons stay paired).

**Per program and method** (:func:`summarize`): the mean per-input AUROC and precision
over the inputs with a defined AUROC, each with its 95% bootstrap-t interval over inputs
(:func:`cwlens.core.bootstrap.studentized`: inputs are resampled; clipped to [0, 1]), and
the paired difference of the AUROC from the level's reference method (attention, rollout,
attention off BOS), resolved by Holm's correction over every comparison of the program
and scope (:func:`cwlens.core.bootstrap.holm`), as cwlens's faithfulness tables do.
"""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from cwlens.core.bootstrap import (
    DEFAULT_BOOT,
    MIN_N,
    PairedDifference,
    holm,
    paired_bootstrap,
    studentized,
)
from cwlens.core.ranking_scores import auroc_rows, precision_rows
from cwlens.errors import ShapeMismatchError
from cwlens.groundtruth import methods

SCOPES = ("main", "with_fallback")
COLUMNS = ("program", "input_id", "length", "method", "level", "scope", "auroc",
           "precision_at_truth", "n_positive", "n_entries", "n_undefined")
SUMMARY_COLUMNS = ("program", "method", "level", "scope", "n", "n_inputs", "auroc", "auroc_low",
                   "auroc_high", "precision_at_truth", "precision_low", "precision_high",
                   "reference", "delta", "delta_low", "delta_high", "p", "resolved")


def visible(n: int, causal: bool) -> torch.Tensor:
    """``[query, key]``: the entries a query can see, minus BOS's own row."""
    seen = torch.ones(n, n, dtype=torch.bool)
    if causal:
        seen = torch.tril(seen)
    seen[0] = False
    return seen


def layer_entries(truth: Any, causal: bool, with_fallback: bool = False,
                  heads: torch.Tensor | None = None) -> torch.Tensor:
    """``[layer, head, query, key]`` bool: the entries scored against ``truth.movement``;
    ``heads`` ``[layer, head]`` bool: the heads scored (default: all; tracr's padding heads
    are left out by :func:`score_input`'s caller)."""
    movement, fallback = truth.movement, truth.fallback
    n = movement.shape[-1]
    keep = visible(n, causal).expand_as(movement).clone()
    if not with_fallback:
        keep &= ~fallback.to(torch.bool)[..., None]
    if heads is not None:
        keep &= heads.to(torch.bool)[..., None, None]
    return keep


def input_entries(n: int, causal: bool) -> torch.Tensor:
    """``[query, key]`` bool: the entries scored against ``truth.dependence``."""
    keep = visible(n, causal)
    keep[:, 0] = False
    return keep


def component_labels(components: Iterable[tuple], n_layers: int, n_heads: int) -> torch.Tensor:
    """``[layer, head]`` bool: the heads among ``components`` (``("attn", layer, head)``)."""
    labels = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    for c in components:
        if c[0] == "attn":
            labels[int(c[1]), int(c[2])] = True
    return labels


def _defined(per_method: Mapping[str, torch.Tensor], labels: torch.Tensor, keep: torch.Tensor,
             level: str) -> torch.Tensor:
    """``keep`` minus the entries where any method's score is NaN (a measure undefined
    there), so that every method of a level is scored on the same entries."""
    out = keep.clone()
    for method, values in per_method.items():
        if values.shape != labels.shape:
            raise ShapeMismatchError(
                f"the {level} scores of {method!r} are {list(values.shape)}, the truth "
                f"{list(labels.shape)}: is the truth of this model's program?")
        out &= ~torch.isnan(values)
    return out


RESOLUTION = 1e-4  # scores closer than this times the input's largest |score| are tied


def resolution(scores: torch.Tensor) -> torch.Tensor:
    """Each row of ``[methods, entries]`` rounded to :data:`RESOLUTION` of its largest
    ``|score|``. A compiled model's softmax is not hard: in ``successor`` a matched key
    gets attention 1.000000 and a query that fell back puts 0.999999 on the BOS (the rest
    leaks onto the other keys). Ranking by such differences would rank the softmax's leak,
    not what the method says (attention would rank every moved pair above every fall-back
    BOS by 1e-6); at this resolution they are ties."""
    if scores.shape[-1] == 0:  # no entry to score (every row fell back)
        return scores
    scale = scores.abs().amax(-1, keepdim=True)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(scores / scale / RESOLUTION)


def score_input(truth: Any, scores: Mapping[str, Mapping[str, torch.Tensor]],
                component_truth: torch.Tensor, causal: bool,
                heads: torch.Tensor | None = None) -> list[dict]:
    """One row per (method, scope) of one input: ``{method, level, scope, auroc,
    precision_at_truth, n_positive, n_entries}``. ``scores``: ``{level: {method: one input's
    scores}}`` (layer ``[layer, head, q, k]``, input ``[q, k]``, component ``[layer, head]``).
    ``heads`` ``[layer, head]`` bool: the heads whose entries are scored at the ``layer``
    and ``component`` levels (default: all; :func:`~cwlens.groundtruth.evaluate.evaluate`
    passes every head but tracr's padding heads)."""
    n = truth.dependence.shape[-1]
    rows = []
    kept_heads = (torch.ones_like(component_truth, dtype=torch.bool) if heads is None
                  else heads.to(torch.bool).cpu())
    masks = {("layer", "main"): layer_entries(truth, causal, heads=kept_heads),
             ("layer", "with_fallback"): layer_entries(truth, causal, True, kept_heads),
             ("input", "main"): input_entries(n, causal),
             ("component", "main"): kept_heads.clone()}
    labels = {"layer": truth.movement, "input": truth.dependence, "component": component_truth}
    for (level, scope), keep in masks.items():
        per = {m: v.detach().cpu() for m, v in scores.get(level, {}).items()}
        y = labels[level].detach().cpu().to(torch.bool)
        if not per:
            continue
        defined = _defined(per, y, keep, level)
        names = list(per)
        stacked = resolution(torch.stack([per[m][defined] for m in names]))  # [methods, entries]
        labels_kept = y[defined]
        a, p = auroc_rows(stacked, labels_kept), precision_rows(stacked, labels_kept)
        common = {"level": level, "scope": scope, "n_positive": int(labels_kept.sum()),
                  "n_entries": int(labels_kept.numel()), "n_undefined": int((keep & ~defined).sum())}
        for i, method in enumerate(names):
            rows.append({"method": method, "auroc": float(a[i]),
                         "precision_at_truth": float(p[i]), **common})
    return rows


def _unit(x) -> float:
    """An interval end clipped to [0, 1], the range of an AUROC or a precision (the
    bootstrap-t interval is symmetric about the mean, so near 1 it can pass it)."""
    return min(1.0, max(0.0, float(x))) if x == x else float("nan")


def _interval(values, n_boot: int, level: float, seed: int) -> tuple[float, float, float]:
    """``(mean, low, high)``: :func:`~cwlens.core.bootstrap.studentized`, or ``[v, v]`` when
    every value is ``v`` (the bootstrap-t would divide rounding noise by rounding noise:
    the mean of 30 copies of 2/3 is not exactly 2/3)."""
    if len(values) and bool((values == values[0]).all()):
        v = float(values[0])
        return v, v, v
    mean, low, high, _ = studentized(values, n_boot, level, seed)
    return float(mean), float(low), float(high)


def _paired(a, b, n_boot: int, level: float, seed: int) -> PairedDifference:
    """:func:`~cwlens.core.bootstrap.paired_bootstrap` of ``b - a``; a difference that is
    the same on every input gets cwlens' convention for a sample without spread (the
    interval ``[d, d]``, ``p = 0`` unless ``d = 0``) without the bootstrap dividing rounding
    noise by rounding noise."""
    d = (b - a).round(12)
    if len(d) >= MIN_N and bool((d == d[0]).all()):
        v = float(d[0])
        return PairedDifference(v, v, v, len(d), v == 0.0, 1.0 if v == 0.0 else 0.0)
    return paired_bootstrap(a, b, n_boot, level, seed)


def summarize(per_input, n_boot: int = DEFAULT_BOOT, level: float = 0.95, seed: int = 0):
    """One row per ``(program, method, scope)`` of the per-input rows (a DataFrame with
    :data:`COLUMNS`): ``n`` inputs with a defined AUROC, ``auroc`` and its ``auroc_low`` /
    ``auroc_high``, ``precision_at_truth`` and its interval, ``delta`` (AUROC minus the
    level's reference, paired by input) with its interval, ``p`` and ``resolved`` (Holm over
    the program's comparisons of the main scope, and separately of the fall-back scope)."""
    import pandas as pd  # heavy: pandas, imported on use

    nan = float("nan")
    rows: list[dict] = []
    for (program, scope), frame in per_input.groupby(["program", "scope"], sort=False):
        tests: dict[int, Any] = {}
        for lv in methods.LEVELS:
            cell = frame[frame["level"] == lv]
            if cell.empty:
                continue
            wide = cell.pivot(index="input_id", columns="method", values="auroc")
            defined = wide.notna().all(axis=1)
            prec = cell.pivot(index="input_id", columns="method", values="precision_at_truth")
            ref = methods.reference(lv)
            order = [m.name for m in methods.of_level(lv) if m.name in wide.columns]
            for name in order:
                # rounded: equal AUROCs (ratios of integer counts) that differ in the last
                # bit would give a spread of 1e-17, and a degenerate bootstrap-t interval
                a = wide.loc[defined, name].to_numpy(dtype=float).round(12)
                p = prec.loc[defined, name].to_numpy(dtype=float).round(12)
                mean, lo, hi = _interval(a, n_boot, level, seed)
                pmean, plo, phi = _interval(p, n_boot, level, seed)
                row = dict(program=program, method=name, level=lv, scope=scope, n=len(a),
                           n_inputs=int(cell["input_id"].nunique()),
                           auroc=float(mean), auroc_low=_unit(lo), auroc_high=_unit(hi),
                           precision_at_truth=float(pmean), precision_low=_unit(plo),
                           precision_high=_unit(phi), reference=ref, delta=nan,
                           delta_low=nan, delta_high=nan, p=nan, resolved=False)
                if name != ref and ref in wide.columns:
                    tests[len(rows)] = _paired(wide.loc[defined, ref].to_numpy(dtype=float).round(12),
                                               a, n_boot, level, seed)
                rows.append(row)
        for i, d in holm(tests, level).items():
            rows[i].update(delta=d.mean, delta_low=d.low, delta_high=d.high, p=d.p,
                           resolved=d.sign != 0)
    return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def per_input_frame(rows: Sequence[dict]):
    """The per-input rows as a DataFrame with :data:`COLUMNS`."""
    import pandas as pd  # heavy: pandas, imported on use

    return pd.DataFrame(list(rows), columns=list(COLUMNS))
