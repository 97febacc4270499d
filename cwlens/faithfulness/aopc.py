"""Perturbation curves and their area (AOPC) per metric, with paired bootstrap differences.

A faithfulness run scores each sample at several removal rates ``r_1 < ... < r_K``. Per
sample ``s``, metric ``m`` and mode, the *damage* ``D_s(m, r)`` is how much worse the
masked model does than the clean one at rate ``r``; the area over the perturbation
curve (DeYoung et al. 2020, "ERASER", with the rates as its bins) is::

    AOPC_s(m) = (1 / K) * sum_k D_s(m, r_k)

Comprehensiveness removes the top-ranked entries (a faithful metric: large AOPC);
sufficiency removes the bottom-ranked ones (a faithful metric: small AOPC).

Two parameterisations of the bins (:data:`PARAMETERISATIONS`), every table says which:

``removed`` (the paper's wording)
    both modes at the removed fractions ``r`` in ERASER's bins 0.01, 0.05, 0.1, 0.2, 0.5:
    sufficiency removes the bottom ``r``, so at least half of every row stays -- the
    gentle end of its curve.
``kept`` (ERASER's sufficiency)
    comprehensiveness as above; sufficiency *keeps* the top ``k`` in 0.01 ... 0.5, i.e.
    removes the bottom ``r = 1 - k`` (0.99, 0.95, 0.9, 0.8, 0.5): the end where metrics
    separate.

A run's AOPC uses the bins among its rates (all five where the run has them; the
bins used are part of the result). The
*faithfulness score* is ``+AOPC`` for comprehensiveness and ``-AOPC`` for sufficiency, so
that "higher = more faithful" in both; differences between metrics are paired by sample
(:func:`cwlens.core.bootstrap.paired_bootstrap`) and a difference is resolved when its 95%
interval excludes 0.

Damage per measure (``D``, bigger = more harm):

``delta_nll`` (default for language modelling)
    ``NLL(masked) - NLL(clean)``, the mean token NLL, i.e. ``log(PPL_masked / PPL_clean)``.
    The log scale keeps AOPC from being decided by the rates at which the model is
    destroyed (ΔPPL reaches 10^4 at 30% removal).
``delta_ppl``
    ``PPL(masked) - PPL(clean)``, as the tables print.
``acc``, ``acc_norm``, ``gold_ll`` (multiple choice)
    ``clean - masked``.
``embedding_damage`` (encoders, :mod:`~cwlens.faithfulness.encoder`)
    ``1 - cos(masked, clean)`` of the sentence embedding, as computed.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from cwlens.core.bootstrap import (
    FLAG,
    MIN_N,
    bca_ci,
    bootstrap_ci,
    flag_note,
    holm,
    outside_validity,
    paired_frame_difference,
    sample_skewness,
)
from cwlens.core.metrics import MODES, REGISTRY, legend
from cwlens.errors import InvalidArgumentError
from cwlens.faithfulness.report import HIERARCHY, standing, table_verdicts

DAMAGE_MEASURES = ("delta_nll", "delta_ppl", "acc", "acc_norm", "gold_ll", "embedding_damage")
KEYS = ("metric", "mode", "sample_id")
# one label per damage measure, for tables and axes
UNITS = {"delta_nll": "ΔNLL (nats/token, masked − clean)", "delta_ppl": "ΔPPL (masked − clean)",
         "acc": "accuracy drop", "acc_norm": "accuracy drop (length-norm.)",
         "gold_ll": "drop of gold log-likelihood", "embedding_damage": "1 − cos(masked, clean embedding)"}


# ERASER's bins (DeYoung et al. 2020): the fraction removed (comprehensiveness) or kept (sufficiency)
ERASER_BINS = (0.01, 0.05, 0.1, 0.2, 0.5)
PARAMETERISATIONS = ("removed", "kept")
PARAMETERISATION_LABELS = {
    "removed": "bins = fraction removed (the paper's wording: sufficiency removes the bottom r "
               "= 0.01..0.5)",
    "kept": "bins = ERASER's (sufficiency keeps the top k = 0.01..0.5, i.e. removes the bottom "
            "r = 1 − k = 0.5..0.99)",
}


def bins(mode: str, parameterisation: str) -> tuple[float, ...]:
    """The removal rates ``r`` of one mode's AOPC in a parameterisation."""
    if parameterisation not in PARAMETERISATIONS:
        raise InvalidArgumentError(f"parameterisation={parameterisation!r}; valid: "
                                   f"{', '.join(map(repr, PARAMETERISATIONS))}.")
    if parameterisation == "removed" or mode == "comprehensiveness":
        return ERASER_BINS
    return tuple(round(1 - k, 10) for k in reversed(ERASER_BINS))


def aopc_bins(damage: pd.DataFrame, parameterisation: str) -> pd.DataFrame:
    """:func:`aopc` per mode over the bins of ``parameterisation`` that the run has (a
    mode with none of them is left out), with columns ``parameterisation`` and ``bins``
    (the removal rates used, e.g. ``"0.1,0.5"``)."""
    present = {round(float(r), 10) for r in damage["rate"]}
    parts = []
    for mode, g in damage.groupby("mode", sort=True):
        rates = [r for r in bins(mode, parameterisation) if r in present]
        if not rates:
            continue
        sub = g[g["rate"].round(10).isin(rates)]
        parts.append(aopc(sub, rates).assign(parameterisation=parameterisation,
                                             bins=",".join(f"{r:g}" for r in rates)))
    if not parts:
        raise InvalidArgumentError(
            f"This run has none of the {parameterisation!r} bins (removal rates "
            f"{sorted(set(bins('comprehensiveness', parameterisation)) | set(bins('sufficiency', parameterisation)))});"
            " rerun with those rates.")
    return pd.concat(parts, ignore_index=True)


def damages(table: pd.DataFrame, measure: str = "delta_nll") -> pd.DataFrame:
    """Per-sample damage rows ``metric, mode, rate, layers, sample_id, damage`` of one run
    (``table``: the rows of :func:`~cwlens.faithfulness.read_results` restricted to one
    dataset and setting; encoder rows carry ``measure = "embedding_damage"``)."""
    if measure not in DAMAGE_MEASURES:
        raise InvalidArgumentError(f"measure={measure!r} is not a damage measure; valid: "
                                   f"{', '.join(DAMAGE_MEASURES)}.")
    cols = ["metric", "mode", "rate", "layers", "sample_id", "damage"]
    if measure == "embedding_damage":  # encoder rows: the damage itself
        out = table[table["measure"] == measure]
        out = out.assign(damage=out["value"])
        if "layers" not in out.columns:
            out["layers"] = "all"
        return out[cols].reset_index(drop=True)
    base = "nll" if measure == "delta_nll" else "ppl" if measure == "delta_ppl" else measure
    rows = table[table["measure"] == base]
    clean = rows[rows["mode"] == "clean"].drop_duplicates("sample_id").set_index("sample_id")["value"]
    cells = rows[rows["mode"] != "clean"]
    if not len(cells):
        raise InvalidArgumentError(f"No masked rows with measure {base!r} in this table.")
    missing = set(cells["sample_id"]) - set(clean.index)
    if missing:
        raise InvalidArgumentError(f"{len(missing)} samples have masked rows but no clean row "
                                   f"(e.g. {sorted(missing)[0]!r}): the results file is incomplete.")
    ref = cells["sample_id"].map(clean)
    sign = 1.0 if measure in ("delta_nll", "delta_ppl") else -1.0
    out = cells.assign(damage=sign * (cells["value"] - ref))
    if "layers" not in out.columns:
        out["layers"] = "all"
    return out[cols].reset_index(drop=True)


def aopc(damage: pd.DataFrame, rates: Sequence[float] | None = None) -> pd.DataFrame:
    """Per ``(metric, mode, sample_id)`` (and ``layers`` where several layer sets were
    masked): ``aopc`` = the mean damage over ``rates`` (default: every rate present) and
    ``score`` (``+aopc`` comprehensiveness, ``-aopc`` sufficiency). A sample must have
    every rate: a missing one is an error, not a silently shorter curve, and a NaN damage
    makes its curve's ``aopc`` NaN (never the mean of the other rates)."""
    rates = sorted(set(damage["rate"])) if rates is None else sorted(rates)
    if not rates:
        raise InvalidArgumentError("AOPC needs at least one removal rate.")
    sub = damage[damage["rate"].isin(rates)]
    keys = [*KEYS, "layers"] if sub["layers"].nunique() > 1 else list(KEYS)
    grouped = sub.groupby(keys, sort=False)
    counts = grouped["rate"].nunique()
    short = counts[counts < len(rates)]
    if len(short):
        raise InvalidArgumentError(
            f"{len(short)} (metric, mode, sample) curves lack some of the rates {rates} "
            f"(e.g. {short.index[0]}): finish the run (rerun the same command) first.")
    # pandas' mean skips NaN: a curve with a NaN damage would read as the mean of the rest
    aopc = grouped["damage"].mean().where(~sub["damage"].isna().groupby(
        [sub[k] for k in keys], sort=False).any())
    out = aopc.rename("aopc").reset_index()
    out["score"] = out["aopc"].where(out["mode"] == "comprehensiveness", -out["aopc"])
    return out


def curve_summary(damage: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per ``(metric, mode, rate)``: ``n``, ``mean``, ``ci_low``, ``ci_high`` of the damage
    (BCa bootstrap of the mean, :func:`cwlens.core.bootstrap.bca_ci`: one rate's damages
    can be float noise plus one or two real values, where a bootstrap-t band explodes): the points of the
    perturbation curves."""
    rows = []
    for (metric, mode, rate), g in damage.groupby(["metric", "mode", "rate"], sort=True):
        lo, hi = bca_ci(g["damage"].to_numpy(), n_boot=n_boot, seed=seed)
        rows.append(dict(metric=metric, mode=mode, rate=float(rate), n=len(g),
                         mean=float(g["damage"].mean()), ci_low=lo, ci_high=hi))
    return pd.DataFrame(rows)


def aopc_summary(per_sample: pd.DataFrame, reference: str = "contribution", n_boot: int = 2000,
                 seed: int = 0) -> pd.DataFrame:
    """Per ``(metric, mode)``: AOPC mean and bootstrap CI, and the paired difference of the
    faithfulness score of the metric minus ``reference``'s (``delta``, ``delta_low``,
    ``delta_high``; positive = more faithful than ``reference``; NaN for the reference
    itself or when it is absent). ``flagged`` / ``delta_flagged``: the per-sample AOPCs /
    the paired differences lie outside the bootstrap-t's validity range
    (:func:`cwlens.core.bootstrap.outside_validity`)."""
    rows: list[dict] = []
    tests: dict = {}
    for mode, g in per_sample.groupby("mode", sort=True):
        cell = g.rename(columns={"score": "value"})
        for metric, m in g.groupby("metric", sort=False):
            values = m["aopc"].to_numpy()
            lo, hi = bootstrap_ci(values, n_boot=n_boot, seed=seed)
            if reference in set(g["metric"]) and metric != reference:
                tests[len(rows)] = paired_frame_difference(cell, "metric", reference, metric,
                                                           n_boot=n_boot, seed=seed)
            rows.append(dict(metric=metric, mode=mode, n=len(m), aopc=float(m["aopc"].mean()),
                             ci_low=lo, ci_high=hi,
                             flagged=bool(outside_validity(len(values), sample_skewness(values)))))
    nan = float("nan")
    for i, d in holm(tests).items():  # one family: every Δ of this table
        rows[i].update(delta=d.mean, delta_low=d.low, delta_high=d.high, p=d.p, resolved=d.sign != 0,
                       delta_flagged=d.flagged)
    for r in rows:
        for k, v in (("delta", nan), ("delta_low", nan), ("delta_high", nan), ("p", nan), ("resolved", False),
                     ("delta_flagged", False)):
            r.setdefault(k, v)
    return pd.DataFrame(rows)


def verdicts(per_sample: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> dict[tuple[str, str], str]:
    """``{(mode, variant): verdict}``: the paper's hierarchy on AOPC scores, with signed
    (``"signed"``) and absolute (``"abs"``) contribution weights as the top metric
    (:func:`~cwlens.faithfulness.report.cell_verdict`)."""
    abs_order = tuple("contribution_abs" if m == "contribution" else m for m in HIERARCHY)
    out = {}
    for variant, order in (("signed", HIERARCHY), ("abs", abs_order)):
        cells = {(mode, variant): g.rename(columns={"score": "value"})
                 for mode, g in per_sample.groupby("mode", sort=True) if order[-1] in set(g["metric"])}
        out.update(table_verdicts(cells, order, n_boot=n_boot, seed=seed))  # Holm over both modes
    return out


def ranking_line(summary: pd.DataFrame, mode: str, metrics: Sequence[str] | None = None) -> str:
    """The metrics of one mode from most to least faithful by mean AOPC score, e.g.
    ``"attn×grad (sup.) > contrib > alti > ..."`` (means only; the table has the CIs)."""
    sub = summary[summary["mode"] == mode]
    if metrics is not None:
        sub = sub[sub["metric"].isin(metrics)]
    sign = 1.0 if mode == "comprehensiveness" else -1.0
    order = sorted(sub.itertuples(), key=lambda r: -sign * r.aopc)
    text = REGISTRY[order[0].metric].short if order else ""
    for prev, r in zip(order, order[1:], strict=False):  # equal means (e.g. vw, vwon) print "="
        text += (" = " if r.aopc == prev.aopc else " > ") + REGISTRY[r.metric].short
    return text


def markdown(summary: pd.DataFrame, measure: str, verdict: dict | None = None,
             reference: str = "contribution", parameterisation: str | None = None,
             bins_used: dict | None = None) -> str:
    """The AOPC table: metric x mode, AOPC mean [95% CI] and the paired difference of the
    faithfulness score against ``reference`` (+ = more faithful than it); then the
    hierarchy verdicts. ``parameterisation`` (:data:`PARAMETERISATIONS`) and
    ``bins_used`` (``{mode: "0.1,0.5"}``) are stated in the caption."""
    short = REGISTRY[reference].short
    n = int(summary["n"].max())
    few = n < MIN_N  # no interval and no paired test (they printed [nan, nan], "unresolved")
    param = ""
    if parameterisation is not None:
        param = f"{PARAMETERISATION_LABELS[parameterisation]}"
        if bins_used:
            param += "; removal rates used: " + "; ".join(
                f"{'comp' if m == 'comprehensiveness' else 'suff'} {b}" for m, b in sorted(bins_used.items()))
        param = f" [{param}]"
    if few:
        caption = (f"AOPC of {UNITS.get(measure, measure)}{param}, mean ({n} sample"
                   f"{'s' if n != 1 else ''}: no interval, the bootstrap needs {MIN_N}); "
                   f"Δ = faithfulness score minus {short}'s, mean (+ = more faithful than {short})")
    else:
        caption = (f"AOPC of {UNITS.get(measure, measure)}{param}, mean [95% bootstrap-t CI], "
                   f"n = {n}; "
                   f"Δ = faithfulness score minus {short}'s, paired bootstrap-t 95% "
                   f"(+ = more faithful than {short}; **bold**: resolved after Holm's correction over "
                   f"every Δ of this table)")
    lines = [caption, "",
             "| metric | comp AOPC | comp Δ | suff AOPC | suff Δ |", "|---|---|---|---|---|"]
    for metric in [m for m in REGISTRY if m in set(summary["metric"])]:
        cells = [REGISTRY[metric].short]
        for mode in MODES:
            hit = summary[(summary["metric"] == metric) & (summary["mode"] == mode)]
            if not len(hit):
                cells += ["", ""]
                continue
            r = hit.iloc[0]
            flag = FLAG if r.get("flagged", False) else ""
            cells.append(_num(r.aopc) if few else f"{_num(r.aopc)} [{_num(r.ci_low)}, {_num(r.ci_high)}]{flag}")
            if r.delta != r.delta:  # NaN: the reference itself
                cells.append("—")
            elif few:
                cells.append(_num(r.delta, "+"))
            else:
                text = f"{_num(r.delta, '+')} [{_num(r.delta_low, '+')}, {_num(r.delta_high, '+')}]"
                flag = FLAG if r.get("delta_flagged", False) else ""
                cells.append((f"**{text}**" if r.resolved else text) + flag)
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", legend(set(summary["metric"])) + " comp / suff: comprehensiveness (top entries "
              "removed) / sufficiency (bottom entries removed)."]
    if few:
        lines += ["", f"No hierarchy: its paired test needs at least {MIN_N} samples (n = {n})."]
    elif verdict:
        lines += ["", "Hierarchy on AOPC (least < most faithful; Holm-corrected over both modes: "
                  "`<` resolved, `≈` unresolved, `=` identical):", ""]
        for (mode, variant), text in sorted(verdict.items()):
            lines.append(f"- {mode}, {'signed c' if variant == 'signed' else '|c|'}: {text}")
    if not few and reference in set(summary["metric"]):
        lines += ["", f"Against {short} (its Δ column; a superlative only where every other "
                  "label-free metric, random included, is resolved on one side):", ""]
        lines += [f"- {standing(summary, mode, reference)}" for mode in MODES
                  if mode in set(summary["mode"])]
    if any(FLAG in line for line in lines):
        lines += ["", flag_note(n)]
    return "\n".join(lines) + "\n"


def _num(x: float, sign: str = "") -> str:
    """Three decimals, or three significant digits below 0.01 (tiny damages stay visible).

    Float round-off below 1e-12 (a mean of exact zeros read as -1.1e-18) prints as 0.000.
    """
    if abs(x) < 1e-12:
        x = 0.0
    return f"{x:{sign}.3g}" if x != 0 and abs(x) < 0.01 else f"{x:{sign}.3f}"


SHARES = ("tied_share", "first_token_share")


def mask_share_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per ``(metric, mode, rate)``: the mean over samples of ``tied_share`` (removed
    entries chosen by the random tie-break: a kept entry had the same score) and
    ``first_token_share`` (removed entries on the first token) of a results table
    (:func:`~cwlens.faithfulness.ranking.mask_counts`); empty for runs that predate them."""
    rows = table[table["measure"].isin(SHARES) & (table["mode"] != "clean")]
    if not len(rows):
        return pd.DataFrame(columns=["metric", "mode", "rate", *SHARES])
    wide = rows.pivot_table(index=["metric", "mode", "rate"], columns="measure", values="value",
                            aggfunc="mean")
    return wide.reindex(columns=list(SHARES)).reset_index()


def shares_markdown(shares: pd.DataFrame) -> str:
    """The share table: metric x (mode, removal rate), ``tied % / first-token %``."""
    if not len(shares):
        return ""
    cols = sorted({(m, r) for m, r in zip(shares["mode"], shares["rate"], strict=True)})
    lines = ["Removed entries chosen by the seeded random tie-break / on the first token, "
             "% (mean over samples; columns: mode and removed fraction r)", "",
             "| metric | " + " | ".join(f"{m[:4]} {r:g}" for m, r in cols) + " |",
             "|---|" + "---|" * len(cols)]
    for metric in [m for m in REGISTRY if m in set(shares["metric"])]:
        cells = []
        for mode, rate in cols:
            hit = shares[(shares["metric"] == metric) & (shares["mode"] == mode) & (shares["rate"] == rate)]
            cells.append("" if not len(hit) else
                         f"{100 * hit.iloc[0]['tied_share']:.0f} / {100 * hit.iloc[0]['first_token_share']:.0f}")
        lines.append(f"| {REGISTRY[metric].short.replace('|', chr(92) + '|')} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
