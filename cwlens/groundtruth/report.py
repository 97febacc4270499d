"""What ``cwlens groundtruth`` writes: the ``--json`` objects, the markdown tables (one per
level, methods x programs) and the files of a run.

A table cell is the mean per-input ROC AUC with its 95% bootstrap-t interval over inputs
(:mod:`cwlens.groundtruth.scoring`); ``▲`` / ``▼`` mark a method whose AUROC is above /
below its level's reference (the first row), resolved by Holm's correction over the
program's comparisons; ``n/a`` is a program whose truth leaves no positive or no negative
entry on any input at that level (e.g. every head is a component).
"""

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cwlens.groundtruth import methods

START, END = "<!-- groundtruth-scores:start -->", "<!-- groundtruth-scores:end -->"
LEVEL_TITLES = {
    "layer": "Per layer and head, against the movement (b)",
    "input": "Per input token, against the input dependence (a)",
    "component": "Per head, against the compiled graph's components (c)",
}


def _num(x: Any) -> float | None:
    """A float for JSON (``None`` for NaN: JSON has no NaN)."""
    x = float(x)
    return None if math.isnan(x) else x


def program_json(scores: Any) -> dict:
    """One program's ``--json`` object (the main scope: fall-back rows left out; NaN written
    as ``null``)::

        {"program", "n_inputs", "output_mismatches", "n_inputs_scored": {level: n},
         "silent_row_threshold",
         "methods": {method: {"level", "auroc", "ci": [lo, hi], "precision_at_truth",
                              "n_inputs_scored"}}}

    ``n_inputs``: the inputs drawn and run (every one of them, at every level);
    ``n_inputs_scored``: those a level's means are over (an input with no positive or no
    negative entry at a level has no AUROC there and is left out, for every method of the
    level); ``output_mismatches``: inputs where the network's output differs from the
    program's (0: such a program is refused); ``silent_row_threshold``: the ``||o||`` at or
    below which, relative to the layer's largest ``||v~||``, a row's output-normalised
    scores are 0 (:func:`cwlens.groundtruth.layer_scores.silent_rows`; 1e-3 unless
    ``--silent-row-threshold`` says otherwise)."""
    main = scores.summary[scores.summary["scope"] == "main"]
    out: dict[str, Any] = {}
    per_level: dict[str, int] = {}
    for r in main.itertuples():
        out[r.method] = {"level": r.level, "auroc": _num(r.auroc),
                         "ci": [_num(r.auroc_low), _num(r.auroc_high)],
                         "precision_at_truth": _num(r.precision_at_truth),
                         "n_inputs_scored": int(r.n)}
        per_level[r.level] = max(per_level.get(r.level, 0), int(r.n))
    return {"program": scores.program, "n_inputs": int(scores.n_inputs),
            "output_mismatches": int(scores.output_mismatches), "n_inputs_scored": per_level,
            "silent_row_threshold": float(scores.silent_row_threshold), "methods": out}


def json_document(results: Sequence[Any]) -> dict | list[dict]:
    """One program: its object; several: a list of them, in the order scored."""
    objects = [program_json(s) for s in results]
    return objects[0] if len(objects) == 1 else objects


def write_json(results: Sequence[Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_document(results), indent=2) + "\n")
    return path


def _cell(r: Any, value: str = "auroc") -> str:
    low, high = ("auroc_low", "auroc_high") if value == "auroc" else ("precision_low", "precision_high")
    mean = getattr(r, value)
    if r.n == 0 or math.isnan(mean):
        return "n/a"
    text = f"{mean:.2f}"
    lo, hi = getattr(r, low), getattr(r, high)
    if not math.isnan(lo):
        text += f" [{lo:.2f}, {hi:.2f}]"
    if value == "auroc" and r.resolved:
        text += " ▲" if r.delta > 0 else " ▼"
    return text


def level_table(summary: Any, level: str, scope: str = "main", value: str = "auroc") -> str:
    """Markdown: one row per method of ``level``, one column per program."""
    sub = summary[(summary["level"] == level) & (summary["scope"] == scope)]
    programs = list(dict.fromkeys(sub["program"]))
    if not programs:
        return ""
    lines = ["| method | " + " | ".join(f"`{p}`" for p in programs) + " |",
             "|---|" + "---|" * len(programs)]
    counts = {p: sub[sub["program"] == p]["n"].max() for p in programs}
    lines.append("| *inputs scored* | " + " | ".join(str(int(counts[p])) for p in programs) + " |")
    for m in methods.of_level(level):  # type: ignore[arg-type]
        cells = []
        for p in programs:
            row = sub[(sub["program"] == p) & (sub["method"] == m.name)]
            cells.append(_cell(next(row.itertuples()), value) if not row.empty else "")
        lines.append(f"| {m.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(summary: Any, n_inputs: int, seed: int, command: str) -> str:
    """Every table of a run, with the caption that says how it was made."""
    parts = [f"Generated by `{command}`: {n_inputs} inputs per program (seed {seed}), mean "
             "per-input ROC AUC [95% bootstrap-t interval over inputs]; ▲/▼: above/below the "
             "level's first row (its attention-based reference), resolved by Holm's correction "
             "over each program's comparisons; n/a: no input has both a positive and a negative "
             "entry. *inputs scored*: the inputs with a defined AUROC at that level.", ""]
    for level in methods.LEVELS:
        table = level_table(summary, level)
        if table:
            parts += [f"**{LEVEL_TITLES[level]}** (ROC AUC)", "", table, ""]
    table = level_table(summary, "layer", scope="with_fallback")
    if table:
        parts += ["**Per layer and head, fall-back rows included** (ROC AUC; every entry of a "
                  "row whose query fell back to BOS is a negative: nothing moved)", "", table, ""]
    for level in methods.LEVELS:
        table = level_table(summary, level, value="precision_at_truth")
        if table:
            parts += [f"**{LEVEL_TITLES[level]}** (precision at \\|truth\\|)", "", table, ""]
    return "\n".join(parts).rstrip() + "\n"


def write_run(results: Sequence[Any], out: str | Path) -> list[Path]:
    """``per_input.csv.gz`` (gzip: ~30 rows per input) and ``summary.csv`` of every program
    scored, under ``out``."""
    import pandas as pd  # heavy: pandas, imported on use

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    per_input = pd.concat([r.per_input for r in results], ignore_index=True)
    summary = pd.concat([r.summary for r in results], ignore_index=True)
    paths = [out / "per_input.csv.gz", out / "summary.csv"]
    per_input.to_csv(paths[0], index=False, compression={"method": "gzip", "mtime": 0})  # same bytes
    summary.to_csv(paths[1], index=False)
    return paths
