"""Markdown tables of a faithfulness summary, and the check of the paper's hierarchy.

The paper's claim (seed summary, §3.1): attention < value-weighted < value-weighted
output-normalised < contribution, i.e. for comprehensiveness the damage (ΔPPL up,
accuracy down) grows along that order, and for sufficiency it shrinks.
"""

HIERARCHY = ("attention", "value_weighted", "value_weighted_output_normalized", "contribution")
SHORT = {
    "attention": "attn",
    "value_weighted": "vw",
    "value_weighted_output_normalized": "vwon",
    "contribution": "contrib",
    "contribution_abs": "abs contrib",
    "random": "random",
}
LM_MEASURE, CHOICE_MEASURE = "delta_ppl", "acc"


def main_measure(summary, dataset: str) -> str:
    present = set(summary.loc[summary.dataset == dataset, "measure"])
    return LM_MEASURE if LM_MEASURE in present else CHOICE_MEASURE


def damage(measure: str, value: float) -> float:
    """Bigger = more harm: ΔPPL as is, accuracy / log-likelihood negated."""
    return value if measure in ("delta_ppl", "ppl", "nll") else -value


def hierarchy_verdict(summary, dataset: str, mode: str, rate: float, measure: str) -> str:
    """Order of the four hierarchy metrics by faithfulness at one cell, e.g.
    ``"attn < vw = vwon < contrib: holds"``."""
    cell = summary[(summary.dataset == dataset) & (summary["mode"] == mode)
                   & (summary.rate == rate) & (summary.measure == measure)]
    means = {m: float(cell.loc[cell.metric == m, "mean"].iloc[0])
             for m in HIERARCHY if (cell.metric == m).any()}
    if len(means) < 2:
        return "n/a"
    # faithfulness score: comprehensiveness wants damage, sufficiency wants none
    sign = 1 if mode == "comprehensiveness" else -1
    score = {m: sign * damage(measure, v) for m, v in means.items()}
    order = sorted(score, key=lambda m: (score[m], HIERARCHY.index(m)))
    parts, prev = [], None
    for m in order:
        if prev is not None:
            parts.append(" = " if abs(score[m] - score[prev]) < 1e-12 else " < ")
        parts.append(SHORT[m])
        prev = m
    expected = [m for m in HIERARCHY if m in score]
    pairs = list(zip(expected, expected[1:], strict=False))
    contrib_best = "contribution" in score and all(
        score["contribution"] > score[m] for m in score if m != "contribution")
    if all(score[a] < score[b] for a, b in pairs):
        verdict = "holds"
    elif all(score[a] <= score[b] for a, b in pairs) and contrib_best:
        verdict = "holds, with ties"
    elif contrib_best:
        verdict = "contribution best, order of the baselines differs"
    else:
        verdict = "does not hold"
    return "".join(parts) + f": {verdict}"


def _fmt(row, measure) -> str:
    scale = 100.0 if measure in ("acc", "acc_norm") else 1.0
    digits = 1 if scale == 100.0 else 2
    m, lo, hi = row["mean"] * scale, row["ci_low"] * scale, row["ci_high"] * scale
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def markdown_tables(summary, datasets=None, measure: str | None = None) -> str:
    """One markdown table per dataset: metric x (mode, rate), mean [95% CI], plus the
    clean value and the hierarchy verdict per (mode, rate)."""
    lines = []
    for ds in datasets or sorted(summary.dataset.unique()):
        meas = measure or main_measure(summary, ds)
        sub = summary[(summary.dataset == ds) & (summary.measure == meas)]
        cells = sub[sub["mode"] != "clean"]
        clean_measure = "ppl" if meas == "delta_ppl" else meas
        clean = summary[(summary.dataset == ds) & (summary.measure == clean_measure)
                        & (summary["mode"] == "clean")]
        cols = sorted({(m, r) for m, r in zip(cells["mode"], cells.rate, strict=True)},
                      key=lambda x: (x[0], x[1]))
        unit = "accuracy, %" if meas in ("acc", "acc_norm") else meas
        n = int(sub["n"].max()) if len(sub) else 0
        scope = ", ".join(sorted(sub.scope.unique()))
        lines.append(f"**{ds}** — {unit}, mean [95% bootstrap CI], n = {n}, scope = {scope}")
        if len(clean):
            lines.append(f"(clean {clean_measure}: {_fmt(clean.iloc[0], clean_measure)})")
        lines.append("")
        head = "| metric | " + " | ".join(
            f"{'comp' if m == 'comprehensiveness' else 'suff'} {r:g}" for m, r in cols) + " |"
        lines += [head, "|" + "---|" * (len(cols) + 1)]
        for metric in [m for m in SHORT if m in set(cells.metric)]:
            row = [SHORT[metric]]
            for mode, rate in cols:
                hit = cells[(cells.metric == metric) & (cells["mode"] == mode) & (cells.rate == rate)]
                row.append(_fmt(hit.iloc[0], meas) if len(hit) else "")
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
        lines.append("Hierarchy (least < most faithful):")
        lines.append("")
        for mode, rate in cols:
            lines.append(f"- {mode} {rate:g}: {hierarchy_verdict(summary, ds, mode, rate, meas)}")
        lines.append("")
    return "\n".join(lines)


START, END = "<!-- faithfulness-results:start -->", "<!-- faithfulness-results:end -->"


def write_block(path, text: str) -> None:
    """Replace the block between :data:`START` and :data:`END` in ``path`` (append it if
    absent; create the file if needed)."""
    from pathlib import Path

    p = Path(path)
    block = f"{START}\n{text.rstrip()}\n{END}\n"
    old = p.read_text() if p.exists() else ""
    if START in old and END in old:
        new = old[: old.index(START)] + block + old[old.index(END) + len(END) :].lstrip("\n")
    else:
        new = old + ("\n" if old and not old.endswith("\n") else "") + block
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(new)
