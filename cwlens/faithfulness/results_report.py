"""The report of finished (or interrupted) faithfulness runs, read back from their results
files: the complete rows, the tables with a note for each unfinished run, and the AOPC
tables, as text that ``cwlens faithfulness`` prints, writes into markdown and draws."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cwlens.errors import InvalidArgumentError
from cwlens.faithfulness import aopc
from cwlens.faithfulness.report import markdown_tables, setting_groups
from cwlens.faithfulness.results import (
    config_path,
    partial_samples,
    read_config,
    read_results,
    split_name,
    summarize,
)

AOPC_START, AOPC_END = "<!-- faithfulness-aopc:start -->", "<!-- faithfulness-aopc:end -->"


@dataclass(frozen=True)
class Tables:
    """The rows a report draws on, their summary, and its text (notes, then tables)."""

    table: Any  # pandas.DataFrame of complete rows
    summary: Any  # :func:`~cwlens.faithfulness.results.summarize` of ``table``
    text: str


def tables(paths, only: Sequence[str] | None = None) -> Tables:
    """The tables of the results files ``paths``, limited to the metrics ``only`` (None:
    all). Samples cut mid-write are left out, as a resume would, and named in a note."""
    table = read_results(paths)
    torn = partial_samples(table)
    table = table[~table.sample_id.isin(torn)]
    if table.empty:
        raise InvalidArgumentError(
            f"no complete result rows in {', '.join(map(str, paths))} (a run stopped before "
            "its first sample was written): run without --report-only to compute them")
    if only is not None:
        held = sorted(set(table.metric) - {"none"})
        absent = [m for m in only if m not in held]
        if absent:
            raise InvalidArgumentError(
                f"--report-only --metrics: no rows of {', '.join(absent)} in "
                f"{', '.join(map(str, paths))}; it holds {', '.join(held)}. Leave --metrics "
                "out for all of them, or run without --report-only to compute the missing ones")
        table = table[table.metric.isin({*only, "none"})]
    summary = summarize(table)
    text = markdown_tables(summary, table)
    notes = _unfinished(paths, table, only)
    if torn:
        notes.append(
            f"**Unfinished run**: {len(torn)} sample(s) only partly written ({', '.join(torn[:5])}"
            f"{', ...' if len(torn) > 5 else ''}) are left out of these tables; rerun the same "
            "command without --report-only to compute them.")
    return Tables(table, summary, "\n".join(notes) + "\n\n" + text if notes else text)


def _unfinished(paths, table, only=None) -> list[str]:
    """One line per results file whose stored configuration has more samples (or a
    metric on fewer samples) than its rows: the tables show an unfinished run."""
    lines = []
    for path in paths:
        cfg_file = config_path(path)
        if not cfg_file.exists():
            continue
        cfg = read_config(cfg_file)
        want = cfg.get("samples")
        if not isinstance(want, list) or not want:
            continue
        if len(paths) == 1:
            rows = table
        else:
            rows = read_results(path)
            rows = rows[~rows.sample_id.isin(partial_samples(rows))]
        have = set(rows.sample_id)
        metrics = [m for m in cfg.get("metrics", []) if only is None or m in only]
        short = [f"{m}: {len(set(rows.sample_id[rows.metric == m]))}" for m in metrics
                 if len(set(rows.sample_id[rows.metric == m])) < len(have)]
        if len(have) < len(want) or short:
            lines.append(f"**Unfinished run**: {path} holds {len(have)} of the {len(want)} samples of "
                         "its configuration" + (f" (samples per metric: {', '.join(short)})" if short else "")
                         + "; rerun the same command without --report-only to finish it.")
    return lines


def dataset_of(path) -> str:
    """The dataset a results file holds (``mmlu`` for ``mmlu_5shot_chat.jsonl.gz``)."""
    base = split_name(path)[0].removesuffix("_chat")
    return base.split("_", 1)[0] if "shot" in base else base


@dataclass(frozen=True)
class AopcSection:
    """The AOPC tables of one dataset and setting (``suffix``, ``model``: as
    :func:`~cwlens.faithfulness.report.setting_groups`), and what its figure draws."""

    dataset: str
    suffix: str
    model: str
    parts: list[str]  # the tables' text, one heading and one table after another
    damage: Any  # :func:`cwlens.faithfulness.aopc.damages`
    summary: Any  # the first table's :func:`~cwlens.faithfulness.aopc.aopc_summary`
    measure: str


def aopc_sections(table):
    """With three or more rates: the AOPC tables (ΔNLL for language modelling, accuracy for
    multiple choice) per dataset and setting, one :class:`AopcSection` at a time."""
    for ds in sorted(table.dataset.unique()):
        for suffix, model, rows in setting_groups(table, ds):
            if rows["rate"][rows["mode"] != "clean"].nunique() < 3:
                continue
            measure = "delta_nll" if (rows.measure == "nll").any() else "acc"
            damage = aopc.damages(rows, measure)
            summary, parts = None, []
            for param in aopc.PARAMETERISATIONS:  # each table names its bins
                try:
                    per_sample = aopc.aopc_bins(damage, param)
                except aopc.InvalidArgumentError:  # none of these bins among the run's rates
                    continue
                bins = dict(zip(per_sample["mode"], per_sample["bins"], strict=True))
                table_ = aopc.aopc_summary(per_sample)
                summary = table_ if summary is None else summary
                parts += [f"**{ds}**{f' ({model})' if model else ''}: area over the perturbation curve",
                          aopc.markdown(table_, measure, aopc.verdicts(per_sample),
                                        parameterisation=param, bins_used=bins)]
            if summary is None:  # no ERASER bin: every rate of the run, as removed fractions
                per_sample = aopc.aopc(damage)
                summary = aopc.aopc_summary(per_sample)
                parts += [f"**{ds}**{f' ({model})' if model else ''}: area over the perturbation "
                          "curve (bins = the run's rates, fraction removed)",
                          aopc.markdown(summary, measure, aopc.verdicts(per_sample))]
            yield AopcSection(ds, suffix, model, parts, damage, summary, measure)
