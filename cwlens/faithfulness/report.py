"""Markdown tables of a faithfulness summary, and the check of the paper's hierarchy.

The paper's claim (seed summary, §3.1): attention < value-weighted < value-weighted
output-normalised < contribution, i.e. for comprehensiveness the damage (ΔPPL up,
accuracy down) grows along that order, and for sufficiency it shrinks.
"""

from cwlens.core import metrics as _metrics
from cwlens.core.bootstrap import FLAG, MIN_N

HIERARCHY = _metrics.HIERARCHY
# table labels of every metric (the registry: cwlens.core.metrics); supervised ones say so
SHORT = {name: m.short for name, m in _metrics.REGISTRY.items()}
LM_MEASURE, CHOICE_MEASURE = "delta_ppl", "acc"


def main_measure(summary, dataset: str) -> str:
    present = set(summary.loc[summary.dataset == dataset, "measure"])
    return LM_MEASURE if LM_MEASURE in present else CHOICE_MEASURE


def damage(measure: str, value: float) -> float:
    """Bigger = more harm: ΔPPL as is, accuracy / log-likelihood negated."""
    return value if measure in ("delta_ppl", "ppl", "nll") else -value


def _group_columns(frame) -> list[str]:
    """Setting columns (and ``layers``) present in ``frame``: one table per value."""
    from cwlens.faithfulness.results import SETTING

    return [c for c in (*SETTING, "layers") if c in frame.columns and c != "dataset"]


def _select(frame, **where):
    """Rows of ``frame`` where each column equals the given value (None/NaN match NaN)."""
    import pandas as pd

    keep = pd.Series(True, index=frame.index)
    for col, value in where.items():
        if col not in frame.columns:
            continue
        if value is None or (isinstance(value, float) and value != value):
            keep &= frame[col].isna()
        else:
            keep &= frame[col] == value
    return frame[keep]


def paired_comparisons(table, dataset: str, mode: str, rate: float, measure: str,
                       setting: dict | None = None, order: tuple[str, ...] = HIERARCHY, **boot):
    """``{(a, b): PairedDifference}`` of the faithfulness score of metric ``b`` minus that
    of ``a`` (comprehensiveness: damage; sufficiency: minus damage), paired by sample, for
    every pair of ``order`` metrics present at one cell. ``setting``: ``{column: value}``
    that selects one run (model, scope, ...; see :data:`~cwlens.faithfulness.results.SETTING`).
    ``boot``: ``n_boot``, ``level``, ``seed`` of the paired bootstrap (:func:`cell_comparisons`)."""
    return cell_comparisons(_score_cell(table, dataset, mode, rate, measure, setting), order, **boot)


def _score_cell(table, dataset, mode, rate, measure, setting):
    """Rows ``metric, sample_id, value`` of one cell, ``value`` = the faithfulness score."""
    if "value" not in table.columns:
        raise TypeError("paired comparisons need the per-sample rows (read_results), not a summary.")
    cell = _select(table, dataset=dataset, mode=mode, rate=rate, measure=measure, **(setting or {}))
    sign = 1.0 if mode == "comprehensiveness" else -1.0
    return cell.assign(value=[sign * damage(measure, v) for v in cell["value"]])


def cell_comparisons(cell, order: tuple[str, ...] = HIERARCHY, n_boot: int = 2000,
                     level: float = 0.95, seed: int = 0):
    """``{(a, b): PairedDifference}`` of ``b`` minus ``a`` for every pair of ``order``
    present in ``cell`` (rows ``metric, sample_id, value``; ``value``: a faithfulness
    score, higher = more faithful), paired by sample."""
    from cwlens.core.bootstrap import paired_frame_difference

    present = [m for m in order if (cell.metric == m).any()]
    return {(a, b): paired_frame_difference(cell, "metric", a, b, n_boot=n_boot, level=level, seed=seed)
            for i, a in enumerate(present) for b in present[i + 1:]}


def hierarchy_verdict(table, dataset: str, mode: str, rate: float, measure: str,
                      setting: dict | None = None, order: tuple[str, ...] = HIERARCHY, **boot) -> str:
    """The four hierarchy metrics ordered by faithfulness at one cell, and whether the
    paper's order holds, from a paired bootstrap of the per-sample differences (``table``:
    the rows of :func:`~cwlens.faithfulness.read_results`).

    The chain lists the metrics by mean score; between neighbours ``<`` means the paired
    95% interval of the difference excludes 0, ``≈`` that it contains 0, ``=`` that the
    two are identical on every sample. The verdict, over the expected order's adjacent
    pairs (attn < vw < vwon < contrib): ``holds`` (every pair resolved in that order),
    ``holds, with ties`` (the others identical), ``not separated (every metric scored
    the same on every sample)`` (every pair identical: a rate that masks nothing in short
    rows, or a few 0/1 items), ``does not hold (a > b)`` (some pair resolved the other way
    round), else ``unresolved (a vs b, ...)``. For example
    ``"attn < vw = vwon < contrib: holds, with ties"``. ``order``: the expected order
    (e.g. with ``contribution_abs`` in place of ``contribution``). ``boot``: ``n_boot``,
    ``level``, ``seed`` of the paired bootstrap (:func:`cell_comparisons`)."""
    return cell_verdict(_score_cell(table, dataset, mode, rate, measure, setting), order, **boot)


def cell_verdict(cell, order: tuple[str, ...] = HIERARCHY, n_boot: int = 2000,
                 level: float = 0.95, seed: int = 0) -> str:
    """:func:`hierarchy_verdict` of one cell of faithfulness scores (rows ``metric,
    sample_id, value``, higher = more faithful; e.g. AOPC, :mod:`~cwlens.faithfulness.aopc`),
    Holm-corrected over the cell's pairs."""
    return table_verdicts({0: cell}, order, n_boot, level, seed)[0]


def table_verdicts(cells: dict, order: tuple[str, ...] = HIERARCHY, n_boot: int = 2000,
                   level: float = 0.95, seed: int = 0) -> dict:
    """``{key: verdict}`` of the cells of one table (``{key: cell}``, see
    :func:`cell_verdict`): every pair of every cell is one test of one family, resolved
    by Holm's correction at ``1 - level`` (:func:`cwlens.core.bootstrap.holm`), so that the
    chance of any false "<" or "does not hold" in the table stays below ``1 - level``."""
    from cwlens.core.bootstrap import holm

    tests = {(key, pair): d for key, cell in cells.items()
             for pair, d in cell_comparisons(cell, order, n_boot, level, seed).items()}
    resolved = holm(tests, level)
    out = {}
    for key in cells:
        pairs = {pair: d for (k, pair), d in resolved.items() if k == key}
        out[key] = _verdict_text(pairs, order)
    return out


def _verdict_text(pairs: dict, order: tuple[str, ...]) -> str:
    present = [m for m in order if any(m in p for p in pairs)]
    if len(present) < 2:
        return "n/a"
    best = order[-1]

    def diff(a, b):  # b minus a
        return pairs[(a, b)] if (a, b) in pairs else _negated(pairs[(b, a)])

    ranked = sorted(present, key=lambda m: (sum(diff(o, m).mean for o in present if o != m),
                                            order.index(m)))
    parts = [SHORT[ranked[0]]]
    for a, b in zip(ranked, ranked[1:], strict=False):
        d = diff(a, b)
        parts += [" = " if d.identical else " < " if d.sign > 0 else " ≈ ", SHORT[b]]
    expected = list(zip(present, present[1:], strict=False))
    signs = {(a, b): (0 if pairs[(a, b)].identical else pairs[(a, b)].sign, pairs[(a, b)].identical)
             for a, b in expected}
    flagged = {pair for pair, d in pairs.items() if d.flagged}

    def mark(a: str, b: str) -> str:  # a pair named in the verdict carries its own FLAG
        return FLAG if (a, b) in flagged else ""

    reversed_ = [f"{SHORT[a]} > {SHORT[b]}{mark(a, b)}" for (a, b), (s, _) in signs.items() if s < 0]
    unresolved = [f"{SHORT[a]} vs {SHORT[b]}{mark(a, b)}" for (a, b), (s, same) in signs.items()
                  if s == 0 and not same]
    named = {(a, b) for (a, b), (s, same) in signs.items() if s < 0 or (s == 0 and not same)}
    if reversed_:
        verdict = f"does not hold ({', '.join(reversed_)})"
    elif unresolved:
        verdict = f"unresolved ({', '.join(unresolved)})"
    elif all(same for _, same in signs.values()):  # e.g. a rate that masks nothing
        verdict = "not separated (every metric scored the same on every sample)"
    elif any(same for _, same in signs.values()):
        verdict = "holds, with ties"
    else:
        verdict = "holds"
    if not verdict.startswith("holds") and best in present and all(
            diff(m, best).sign > 0 for m in present if m != best):
        verdict += f"; {best.replace('_', ' ')} best"
    # pairs outside the bootstrap-t's validity range (cwlens.core.bootstrap.flag_note) that
    # the verdict has not named already: each pair is written once
    others = [f"{SHORT[a]} vs {SHORT[b]}" for (a, b) in pairs if (a, b) in flagged - named]
    if others:
        verdict += f" ({FLAG} {'also ' if named & flagged else ''}{', '.join(others)})"
    return "".join(parts) + f": {verdict}"


ADJECTIVE = {"comprehensiveness": "comprehensive", "sufficiency": "sufficient"}


def standing(summary, mode: str, reference: str = "contribution") -> str:
    """Where ``reference`` stands in one mode of an AOPC table, derived from its Δ column
    (:func:`cwlens.faithfulness.aopc.aopc_summary`: ``metric, mode, delta, resolved``; Δ =
    the metric's faithfulness score minus the reference's, resolved after Holm).

    The metrics are sorted into resolved more faithful, resolved less faithful and not
    resolved. A superlative is written only when the table earns it: "the least
    sufficient label-free metric" when *every* other label-free metric (random included;
    supervised ones are references, not rivals) is resolved more sufficient, "the most"
    when every one is resolved less. For example ``"sufficiency: contrib is the least
    sufficient label-free metric; resolved more sufficient: attn, vw; resolved less: none;
    not resolved: none"``. A metric whose Δ lies outside the bootstrap-t's validity range
    (``delta_flagged``) is named with :data:`~cwlens.core.bootstrap.FLAG`."""
    from cwlens.core.metrics import REGISTRY

    adj = ADJECTIVE.get(mode, "faithful")
    rows = summary[(summary["mode"] == mode) & (summary["metric"] != reference)]
    order = [m for m in REGISTRY if m in set(rows["metric"])]
    group: dict[str, list[str]] = {"more": [], "less": [], "unresolved": []}
    flagged: set[str] = set()  # Δs outside the bootstrap-t's validity range: named with a †
    for metric in order:
        r = rows[rows["metric"] == metric].iloc[0]
        key = "unresolved" if not bool(r["resolved"]) else "more" if r["delta"] > 0 else "less"
        group[key].append(metric)
        if bool(r.get("delta_flagged", False)):
            flagged.add(metric)
    free = [m for m in order if not REGISTRY[m].supervised]
    short = REGISTRY[reference].short if reference in REGISTRY else reference
    head = f"{mode}: "
    if free and all(m in group["more"] for m in free):
        head += f"{short} is the least {adj} label-free metric; "
    elif free and all(m in group["less"] for m in free):
        head += f"{short} is the most {adj} label-free metric; "

    def names(key: str) -> str:
        return ", ".join(REGISTRY[m].short + (FLAG if m in flagged else "") for m in group[key]) or "none"

    return (head + f"resolved more {adj} than {short}: {names('more')}; resolved less: "
            f"{names('less')}; not resolved: {names('unresolved')}")


def _negated(d):
    from dataclasses import replace

    return replace(d, mean=-d.mean, low=-d.high, high=-d.low, skewness=-d.skewness)


def _parameterisation(mode: str, rate: float) -> str:
    """The removed fraction in both wordings: the paper's (bottom / top ``r`` removed) and,
    for sufficiency, ERASER's (the top ``1 - r`` kept)."""
    if mode == "comprehensiveness":
        return f"top {rate:g} removed"
    return f"bottom {rate:g} removed = top {1 - rate:.2g} kept"


def _fmt(row, measure) -> str:
    scale = 100.0 if measure in ("acc", "acc_norm") else 1.0
    digits = 1 if scale == 100.0 else 2
    m, lo, hi = row["mean"] * scale, row["ci_low"] * scale, row["ci_high"] * scale
    if lo != lo or hi != hi:  # NaN: one sample has no interval (the table's header says so)
        return f"{m:.{digits}f}"
    return f"{m:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]" + _flag(row)


def _flag(row) -> str:
    """:data:`~cwlens.core.bootstrap.FLAG` for a bootstrap-t cell outside its validity
    range (a summary row's ``n`` and ``skewness``; exact intervals have none)."""
    from cwlens.core.bootstrap import outside_validity

    skew = row.get("skewness", float("nan"))
    return FLAG if outside_validity(int(row["n"]), skew) else ""


def _groups(summary, dataset):
    """``[(setting dict, rows)]``: one per distinct setting (and layer set) of ``dataset``."""
    sub = summary[summary.dataset == dataset]
    cols = _group_columns(sub)
    cells = sub[sub["mode"] != "clean"]
    if not cols or not len(cells):
        return [({}, sub)]
    out = []
    for key, _ in cells.groupby(cols, sort=True, dropna=False):
        setting = dict(zip(cols, key, strict=True))
        clean_setting = {k: v for k, v in setting.items() if k != "layers"}
        rows = _select(sub, **clean_setting)
        rows = rows[(rows["mode"] == "clean") | (rows.get("layers") == setting.get("layers"))]
        out.append((setting, rows))
    return out


def setting_groups(summary, dataset: str):
    """``[(suffix, model, rows)]``, one per setting of ``dataset`` (layer sets stay
    together): ``suffix`` is ``""`` when there is one setting, else ``"_<k>"``."""
    sub = summary[summary.dataset == dataset]
    cols = [c for c in _group_columns(sub) if c != "layers"]
    if not cols:
        return [("", "", sub)]
    keys = list(sub[cols].drop_duplicates().itertuples(index=False, name=None))
    out = []
    for k, key in enumerate(keys):
        setting = dict(zip(cols, key, strict=True))
        suffix = "" if len(keys) == 1 else f"_{k}"
        out.append((suffix, setting.get("model") or "", _select(sub, **setting)))
    return out


def _describe(setting: dict, varying: set) -> str:
    """The setting columns that tell this table from the others, and the masked layers
    whenever they are not all (a ``--layers 1`` run read as an all-layer result)."""
    parts = [f"{k} = {setting[k]}" for k in setting if k in varying]
    if "layers" not in varying and masked_layers(setting.get("layers")):
        parts.append(f"masked layers = {setting['layers']}")
    return ", ".join(parts)


def masked_layers(label) -> bool:
    """Whether a ``layers`` label names a subset (not ``all``, the clean rows' ``none``
    or missing)."""
    return isinstance(label, str) and label not in ("all", "none", "")


def markdown_tables(summary, table=None, datasets=None, measure: str | None = None,
                    n_boot: int = 2000, seed: int = 0) -> str:
    """One markdown table per dataset (and per setting, where files of several models or
    settings are read together): metric x (mode, rate), mean [95% CI], plus the clean
    value and, with ``table`` (the per-sample rows), the hierarchy verdict per (mode,
    rate) from a paired bootstrap (:func:`hierarchy_verdict`)."""
    lines = []
    for ds in datasets or sorted(summary.dataset.unique()):
        meas = measure or main_measure(summary, ds)
        groups = _groups(summary, ds)
        varying = {c for c in _group_columns(summary)
                   if len({str(s.get(c)) for s, _ in groups}) > 1}
        for setting, rows in groups:
            lines += _one_table(ds, meas, setting, rows, table, varying, n_boot, seed)
    return "\n".join(lines)


def _one_table(ds, meas, setting, rows, table, varying, n_boot, seed) -> list[str]:
    lines = []
    sub = rows[rows.measure == meas]
    cells = sub[sub["mode"] != "clean"]
    clean_measure = "ppl" if meas == "delta_ppl" else meas
    clean = rows[(rows.measure == clean_measure) & (rows["mode"] == "clean")]
    cols = sorted({(m, r) for m, r in zip(cells["mode"], cells.rate, strict=True)},
                  key=lambda x: (x[0], x[1]))
    unit = "accuracy, %" if meas in ("acc", "acc_norm") else meas
    n = int(sub["n"].max()) if len(sub) else 0
    scope = ", ".join(sorted(map(str, sub.scope.unique())))
    extra = _describe(setting, varying)
    ci = "exact 95% CI (Clopper–Pearson)" if meas in ("acc", "acc_norm") else "95% bootstrap CI"
    interval = (f"mean [{ci}]" if n >= MIN_N or meas in ("acc", "acc_norm") else
                f"mean ({n} sample{'s' if n != 1 else ''}: no interval, the bootstrap needs {MIN_N})")
    lines.append(f"**{ds}** — {unit}, {interval}, n = {n}, scope = {scope}"
                 + (f", {extra}" if extra else ""))
    if len(clean):
        lines.append(f"(clean {clean_measure}: {_fmt(clean.iloc[0], clean_measure)})")
    lines.append("")
    head = "| metric | " + " | ".join(
        f"{'comp' if m == 'comprehensiveness' else 'suff'} {r:g}" for m, r in cols) + " |"
    lines += [head, "|" + "---|" * (len(cols) + 1)]
    for metric in [m for m in SHORT if m in set(cells.metric)]:
        row = [SHORT[metric].replace("|", "\\|")]  # |attn×grad|: not a column break
        for mode, rate in cols:
            hit = cells[(cells.metric == metric) & (cells["mode"] == mode) & (cells.rate == rate)]
            row.append(_fmt(hit.iloc[0], meas) if len(hit) else "")
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", _metrics.legend(set(cells.metric)) + " comp r / suff r: comprehensiveness / "
              f"sufficiency, the top / bottom r of each {scope or 'row'}'s entries removed.", ""]
    if table is not None and n < MIN_N:
        lines += [f"No hierarchy: its paired test needs at least {MIN_N} samples (n = {n}).", ""]
    elif table is not None:
        lines.append("Hierarchy (least < most faithful; paired bootstrap-t of per-sample "
                     "differences, Holm-corrected over every pair of every column of this "
                     "table at 5%: `<` resolved, `≈` not resolved, `=` identical):")
        lines.append("")
        verdicts = table_verdicts({(mode, rate): _score_cell(table, ds, mode, rate, meas, setting)
                                   for mode, rate in cols}, n_boot=n_boot, seed=seed)
        for mode, rate in cols:
            lines.append(f"- {mode} {rate:g} ({_parameterisation(mode, rate)}): "
                         f"{verdicts[(mode, rate)]}")
        lines.append("")
    if any(FLAG in line for line in lines):
        from cwlens.core.bootstrap import flag_note

        lines += [flag_note(n), ""]
    return lines


START, END = "<!-- faithfulness-results:start -->", "<!-- faithfulness-results:end -->"


def _marker_line(text: str, marker: str, start: int = 0) -> int:
    """Index of the first line at or after ``start`` that is exactly ``marker`` (a marker
    quoted inside other text is not one); -1 if none."""
    import re

    m = re.compile(rf"^{re.escape(marker)}[ \t]*$", re.M).search(text, start)
    return m.start() if m else -1


def _read_markdown(p) -> str:
    from cwlens.errors import InvalidArgumentError

    try:
        return p.read_text(encoding="utf-8") if p.exists() else ""
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(
            f"{p} is not UTF-8 text (byte {e.start}), so its generated block cannot be "
            "replaced: give a Markdown file, or a new path") from None


def _block_span(p, old: str, start: str, end: str) -> tuple[int, int]:
    """Where the block's start and end marker lines begin in ``old`` (-1, -1 if absent).
    A start marker without an end after it, or two start markers, raise."""
    from cwlens.errors import InvalidArgumentError

    begin = _marker_line(old, start)
    if begin < 0:
        return -1, -1
    stop = _marker_line(old, end, begin + len(start))

    def line(at: int) -> int:
        return old.count("\n", 0, at) + 1

    if stop < 0:
        raise InvalidArgumentError(
            f"{p} line {line(begin)} opens a generated block ({start}) that no {end} line "
            "closes: add the end marker after the old block, or delete the start marker "
            "(the block is then appended). Nothing was written.")
    again = _marker_line(old, start, begin + len(start))
    if again >= 0:
        raise InvalidArgumentError(
            f"{p} has two {start} lines (lines {line(begin)} and {line(again)}): keep one "
            "generated block and delete the other. Nothing was written.")
    return begin, stop


def check_block(path, start: str = START, end: str = END) -> None:
    """Raise now (before a long run) if :func:`write_block` could not write ``path``."""
    from pathlib import Path

    p = Path(path)
    _block_span(p, _read_markdown(p), start, end)


def has_block(path, start: str = START) -> bool:
    from pathlib import Path

    p = Path(path)
    return _marker_line(_read_markdown(p), start) >= 0


def write_block(path, text: str, start: str = START, end: str = END) -> None:
    """Replace the block between the ``start`` and ``end`` markers (default :data:`START`,
    :data:`END`) in ``path`` (append it if absent; create the file if needed). Markers count
    only on lines of their own; the block ends at the first end marker *after* the start
    marker. An unclosed or repeated start marker, or a file that is not UTF-8, raises
    :class:`~cwlens.errors.InvalidArgumentError` and nothing is written. The file is
    replaced atomically."""
    from pathlib import Path

    from cwlens.runs.results_io import atomic_write_text

    p = Path(path)
    block = f"{start}\n{text.rstrip()}\n{end}\n"
    old = _read_markdown(p)
    begin, stop = _block_span(p, old, start, end)
    if begin >= 0:
        rest = old[stop + len(end) :]
        new = old[:begin] + block + (rest[1:] if rest.startswith("\n") else rest)
    else:
        new = old + ("\n" if old and not old.endswith("\n") else "") + block
    atomic_write_text(p, new)
