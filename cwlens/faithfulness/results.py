"""Tidy results on disk: one JSON line per (sample, condition, measure), appended as each
sample finishes, so that an interrupted run resumes where it stopped.

Columns (:data:`COLUMNS`): the run's setting (:data:`SETTING`: ``model, dataset, scope,
kind, renormalize, causal_only, mask_first_token, max_tokens, seed``), the condition
(``metric, mode, rate, layers``), ``sample_id, measure, value``. The clean run has
``metric="none", mode="clean", rate=0``. Measures: ``nll``, ``ppl``, ``delta_ppl``
(language modelling); ``acc``, ``acc_norm``, ``gold_ll`` (multiple choice). Every column
but ``value`` is the row's key (:data:`KEY`): reading de-duplicates by it (the first row
read wins), so two runs, a rerun, or a file read twice never count a sample twice, and
files of different models or settings are never pooled (:func:`summarize` groups by
the setting).

A sample's rows are written with one ``write``, flushed and fsynced
(:func:`cwlens.runs.results_io.append_text`). On resume the file is cut back to its last
complete line and samples with fewer rows than expected (a write cut by a kill) are
dropped (atomic rewrite) and recomputed. ``<name>.config.json`` beside the file holds the
run's configuration; resuming with another configuration is refused.

Compressed: a path ending in ``.jsonl.gz`` stores the same lines gzip-compressed, one
gzip member per sample (multiple-choice runs write ~900 rows per item: ~300 KB as JSON,
~6 KB gzipped). Everything below holds for both; ``gzip x.jsonl`` turns a finished or
interrupted plain file into one that resumes (the configuration file ``x.config.json``
is shared).

Shards (for runs split over processes): ``<name>.shard-<id>.jsonl`` beside ``<name>.jsonl``
holds the rows one process wrote (``ResultsWriter(..., shard=id)``; a torchrun job's
rank ``r`` writes :func:`shard_name` ``(r)``). Every reader and every writer's resume
treat the main file and all its shards as one table, so a job killed with kill -9 and
rerun with any number of processes computes only the missing samples. At the end of a
run :func:`merge_shards` folds the shards into ``<name>.jsonl`` in the order a
one-process run writes (the file is then byte-identical to that run's).
"""

import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from cwlens.core.bootstrap import (
    bootstrap_ci,  # noqa: F401  (public here since 0.1)
    positive_ci,
    sample_skewness,
)
from cwlens.core.proportion import clopper_pearson
from cwlens.errors import CwlensError
from cwlens.faithfulness.config import PROVENANCE
from cwlens.runs.results_io import (
    append_text,
    atomic_write_lines,
    atomic_write_text,
    complete_lines,
    gzip_members,
    is_gzip,
)

SETTING = ("model", "dataset", *PROVENANCE)  # FaithfulnessConfig's provenance fields
COLUMNS = (*SETTING, "metric", "mode", "rate", "layers", "sample_id", "measure", "value")
KEY = tuple(c for c in COLUMNS if c != "value")
CELL = (*SETTING, "metric", "mode", "rate", "layers", "measure")
ACCURACY = ("acc", "acc_norm")  # per-item 0/1 measures: exact intervals (summarize)
POSITIVE = ("ppl", "nll")  # positive per-sample measures: intervals on the log scale (summarize)


class ConfigMismatchError(CwlensError, ValueError):
    """Resuming into a results file made with another configuration."""


class ResultsFormatError(CwlensError, ValueError):
    """A results file with a malformed line."""


def split_name(path) -> tuple[str, str]:
    """``(base, extension)`` of a results file: ``x.jsonl.gz`` -> ``("x", ".jsonl.gz")``,
    ``x.jsonl`` -> ``("x", ".jsonl")``."""
    path = Path(path)
    if is_gzip(path):
        inner = Path(path.stem)
        return inner.stem, inner.suffix + path.suffix
    return path.stem, path.suffix


def config_path(path) -> Path:
    """The configuration file beside a results file: ``<base>.config.json`` (the same for
    ``x.jsonl`` and ``x.jsonl.gz``)."""
    return Path(path).with_name(f"{split_name(path)[0]}.config.json")


def same_config(a: dict, b: dict) -> bool:
    """Whether two stored configurations describe the same run: equal, but for the order
    of ``metrics`` (a metric's rows do not depend on the others', nor on their order),
    and as stored: a tuple equals the list JSON reads back."""
    def key(cfg):
        cfg = json.loads(json.dumps(cfg))
        m = cfg.get("metrics")
        return {**cfg, "metrics": sorted(m)} if isinstance(m, list) else cfg

    return key(a) == key(b)


def read_config(path) -> dict:
    """The configuration stored in the file ``path`` (a ``<base>.config.json``); a file
    that is not a JSON object raises :class:`ConfigMismatchError` naming the fix."""
    try:
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigMismatchError(
            f"{path} is not readable JSON ({e}): it records the configuration of the results "
            "beside it. Restore it (e.g. from version control), or start afresh with another "
            "output path or --no-resume.") from None
    if not isinstance(cfg, dict):
        raise ConfigMismatchError(f"{path} holds a JSON {type(cfg).__name__}, not the object "
                                  "of a run's configuration: restore it, or use --no-resume")
    return cfg


def result_files(path) -> list[Path]:
    """``path`` and its shard files ``<base>.shard-*<ext>`` that exist, in a fixed order."""
    path = Path(path)
    base, ext = split_name(path)
    shards = sorted(path.parent.glob(f"{base}.shard-*{ext}"))
    return [p for p in [path, *shards] if p.exists()]


def shard_name(rank: int) -> str:
    """The shard id of a torchrun job's rank ``rank``: ``rank00001``."""
    return f"rank{rank:05d}"


def _parse(line: str, path: Path, number: int) -> dict:
    try:
        row = json.loads(line)
    except ValueError as e:
        raise ResultsFormatError(
            f"{path}, line {number}: not a JSON row ({e}). The file was edited or corrupted; "
            "delete that line (the sample is recomputed on the next run)."
        ) from None
    missing = [c for c in REQUIRED if not isinstance(row, dict) or c not in row]
    if missing:
        raise ResultsFormatError(
            f"{path}, line {number}: a JSON {type(row).__name__} without the row field(s) "
            f"{', '.join(missing)}. The file was edited or corrupted; delete that line (the "
            "sample is recomputed on the next run).")
    return row


REQUIRED = ("sample_id", "metric", "mode", "measure", "value")  # every row, old files too


def _key(row: dict) -> tuple:
    return tuple(json.dumps(row.get(c)) for c in KEY)


def _samples_differ(old: list, new: list) -> str:
    """Which samples differ, in words (a --file's id carries a hash of its text, so an
    edited file is another sample)."""
    gone = [i for i in old if i not in set(new)]
    added = [i for i in new if i not in set(old)]
    text = f" The stored run has {len(old)} sample(s), this one {len(new)}"
    if gone or added:
        text += (f"; {len(added)} are not in the stored run (e.g. {added[0]!r})" if added else "") + \
                (f"; {len(gone)} stored ones are not asked (e.g. {gone[0]!r})" if gone else "")
    else:
        text += " in another order"
    text += "."
    if any(str(i).startswith("file_") for i in added):
        text += " A --file sample's id ends with a hash of its text: the file changed since the stored run."
    return text


class ResultsWriter:
    """Append-only JSONL writer with resume (see the module docstring).

    Args:
        path: the ``.jsonl`` file.
        config: a JSON-able dict describing the run; must match on resume.
        rows_per_sample: how many rows (distinct keys) a finished sample has.
        resume: keep finished samples (default); False starts the file (and its shards)
            afresh.
        shard: write to ``<stem>.shard-<shard>.jsonl`` instead of ``path`` (one writer per
            process of a split run); finished samples are read from all of them.
        only_metrics: a run that adds these metrics to a finished one
            (:mod:`cwlens.faithfulness.added_metrics`): a sample is finished when it has
            ``rows_per_sample`` rows of these metrics and the clean run, and only these
            metrics' rows of an unfinished sample are dropped on open.

    Call it under :func:`cwlens.runs.results_io.results_lock` on the folder (as
    :func:`~cwlens.faithfulness.run_faithfulness` does): it repairs its own file on open.
    """

    def __init__(self, path, config: dict, rows_per_sample: int, resume: bool = True,
                 shard: str | None = None, only_metrics: Iterable[str] | None = None):
        self.main = Path(path)
        self.only = None if only_metrics is None else set(only_metrics)
        self.main.parent.mkdir(parents=True, exist_ok=True)
        base, ext = split_name(self.main)
        self.path = self.main if shard is None else self.main.with_name(f"{base}.shard-{shard}{ext}")
        self.config_path = config_path(self.main)
        self.rows_per_sample = rows_per_sample
        config = json.loads(json.dumps(config))
        existing = result_files(self.main)
        if not resume:  # afresh: the rows in the other format (plain / .gz) go too
            plain = str(self.main)[: -len(".gz")] if is_gzip(self.main) else None
            other = Path(plain) if plain else self.main.with_name(self.main.name + ".gz")
            for p in [*existing, *(result_files(other) if other.exists() else [])]:
                p.unlink()
            existing = []
        elif existing:
            if not self.config_path.exists():
                raise ConfigMismatchError(
                    f"{self.main} holds results but {self.config_path.name}, the record of "
                    "their configuration, is missing beside it, so they cannot be resumed. "
                    "Restore it (e.g. from version control), or use another output path "
                    "(--out), or start afresh: --no-resume on the command line, resume=False "
                    "in Python.")
            old = read_config(self.config_path)
            if not same_config(old, config):
                diff = sorted(k for k in set(old) | set(config) if old.get(k) != config.get(k))
                why = (" --batch-tokens fixes the batches, so that a resumed run writes the "
                       "numbers of an uninterrupted one bit for bit; after running out of "
                       "memory, lower it with another --out." if "batch_tokens" in diff else "")
                if "samples" in diff:
                    why += _samples_differ(old.get("samples") or [], config.get("samples") or [])
                raise ConfigMismatchError(
                    f"{self.main} was written with another configuration (differs in "
                    f"{', '.join(diff)}).{why} Use another output path (--out), or start it "
                    "afresh: --no-resume (cwlens faithfulness), resume=False in Python; for "
                    "cwlens replicate, another --out or delete that model's folder."
                )
        text = json.dumps(config, indent=1, sort_keys=True)
        if not (self.config_path.exists() and self.config_path.read_text() == text):
            atomic_write_text(self.config_path, text)  # unchanged: no write (read-only folders work)
        self.done = self._load_done()

    def _load_done(self) -> set[str]:
        own = complete_lines(self.path, repair=True)
        keys: dict[str, set] = {}
        only = self.only

        def counted(row: dict) -> bool:
            return only is None or row.get("metric") in only or row.get("metric") == "none"

        for p in result_files(self.main):
            lines = own if p == self.path else complete_lines(p)
            for i, line in enumerate(lines, 1):
                row = _parse(line, p, i)
                if counted(row):
                    keys.setdefault(row["sample_id"], set()).add(_key(row))
        done = {s for s, k in keys.items() if len(k) >= self.rows_per_sample}

        def keep(line: str) -> bool:
            row = json.loads(line)
            return row["sample_id"] in done or (only is not None and row.get("metric") not in only)

        kept = [ln for ln in own if keep(ln)]
        if len(kept) != len(own):  # a sample cut mid-write: drop its rows
            atomic_write_lines(self.path, "".join(ln + "\n" for ln in kept))
        return done

    def write_sample(self, rows: Sequence[dict]) -> None:
        """All rows of one finished sample, in one write, flushed and fsynced."""
        if len(rows) != self.rows_per_sample:
            raise ValueError(f"expected {self.rows_per_sample} rows, got {len(rows)}")
        append_text(self.path, "".join(json.dumps({c: r.get(c) for c in COLUMNS}) + "\n" for r in rows))
        self.done.add(rows[0]["sample_id"])


def read_results(paths: str | Path | Iterable[str | Path]):
    """A pandas DataFrame of every complete row in one or more ``.jsonl`` files (each with
    its shards), de-duplicated by :data:`KEY` (the first row read wins). Files without
    the newer setting columns read them as missing."""
    import pandas as pd  # heavy: pandas, imported on use

    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows, seen = [], set()
    for p in dict.fromkeys(Path(x).resolve() for x in paths):
        files = result_files(p)
        if not files:
            raise FileNotFoundError(f"No results file {p}.")
        for f in files:
            for i, line in enumerate(complete_lines(f), 1):  # a torn last line is ignored
                row = _parse(line, f, i)
                k = _key(row)
                if k not in seen:
                    seen.add(k)
                    rows.append(row)
    return pd.DataFrame(rows, columns=list(COLUMNS))


def clean_values(path, config: dict, measure: str = "acc") -> dict[str, float]:
    """By sample id, the clean run's ``measure`` already in ``path`` (with its shards),
    when the configuration stored beside it is ``config``: what a resumed run's clean
    accuracy check reads instead of running those items again. Empty when there is no
    such file or it was written with another configuration (a run that would refuse to
    resume from it). A complete clean row of a sample cut short by a kill holds the value
    computed, so it is read too."""
    path = Path(path)
    files = result_files(path)
    stored = config_path(path)
    if not files or not stored.exists():
        return {}
    if not same_config(read_config(stored), config):
        return {}
    values: dict[str, float] = {}
    for f in files:
        for i, line in enumerate(complete_lines(f), 1):
            if '"clean"' not in line:  # most rows: skip the parse
                continue
            row = _parse(line, f, i)
            if row["mode"] == "clean" and row["measure"] == measure:
                values.setdefault(row["sample_id"], float(row["value"]))
    return values


def partial_samples(df) -> list[str]:
    """The samples of ``df`` (a :func:`read_results` table) written only in part: fewer
    rows of some metric (in one setting) than that metric's fullest sample has -- a write
    cut by a kill or a full disk. A writer drops them on open (and recomputes them); a
    report should leave them out too, or its cells count fewer samples than its header.
    A metric missing from a sample altogether is not counted here (a run that added
    metrics later, :mod:`cwlens.faithfulness.added_metrics`, is unfinished, not torn)."""
    if df.empty:
        return []
    group = [c for c in (*SETTING, "metric") if c in df.columns]
    counts = df.groupby([*group, "sample_id"], dropna=False).size().rename("rows").reset_index()
    most = counts.groupby(group, dropna=False)["rows"].transform("max")
    return sorted(set(counts.sample_id[counts.rows < most]))


def _interval(measure, values, n_boot: int, level: float, seed: int) -> tuple[float, float]:
    """The exact (Clopper–Pearson) interval of an accuracy (0/1 per item: a proportion,
    as ``cwlens accuracy`` reports the clean one; a bootstrap-t of 0/1 values leaves
    [0, 1] and is degenerate at 0 or n correct); for a positive measure (:data:`POSITIVE`:
    perplexity, NLL) the bootstrap-t on the log scale, which stays above zero
    (:func:`cwlens.core.bootstrap.positive_ci`); else the bootstrap-t of the mean."""
    if measure in ACCURACY and len(values) and set(values.tolist()) <= {0.0, 1.0}:
        return clopper_pearson(int(values.sum()), len(values), level)
    if measure in POSITIVE:
        return positive_ci(values, n_boot, level, seed)
    return bootstrap_ci(values, n_boot, level, seed)


def summarize(df, n_boot: int = 2000, level: float = 0.95, seed: int = 0):
    """Mean and 95% interval per cell (:data:`CELL`: the setting, the condition and the
    measure), over the de-duplicated rows: exact (Clopper–Pearson) for accuracies,
    bootstrap-t on the log scale for perplexity and NLL (positive:
    :data:`POSITIVE`), bootstrap-t for every other measure, with the values' ``skewness``
    (:func:`cwlens.core.bootstrap.sample_skewness`; NaN for an exact interval), which
    places a bootstrap-t cell inside or outside its validity range
    (:func:`cwlens.core.bootstrap.outside_validity`)."""
    import pandas as pd  # heavy: pandas, imported on use

    df = df.drop_duplicates(subset=[c for c in KEY if c in df.columns])
    for c in COLUMNS:
        if c not in df.columns:
            df = df.assign(**{c: None})
    out = []
    for key, group in df.groupby(list(CELL), sort=True, dropna=False):
        values = group.sort_values("sample_id")["value"].to_numpy(dtype=float)
        measure = key[CELL.index("measure")]
        low, high = _interval(measure, values, n_boot, level, seed)
        exact = measure in ACCURACY and set(values.tolist()) <= {0.0, 1.0}  # _interval's test
        out.append({**dict(zip(CELL, key, strict=True)), "n": len(values),
                    "mean": float(values.mean()), "ci_low": low, "ci_high": high,
                    "skewness": float("nan") if exact else float(sample_skewness(values))})
    return pd.DataFrame(out, columns=[*CELL, "n", "mean", "ci_low", "ci_high", "skewness"])


def merge_shards(path, rows_per_sample: int, order: Sequence[str] = ()) -> Path:
    """Fold the shard files of ``path`` into ``path`` itself and remove them.

    Kept: every sample whose rows in one file are complete (``rows_per_sample`` distinct
    keys: one finished write; a write cut by a kill is dropped), de-duplicated by
    :data:`KEY` (the first row read wins: the main file, then the shards by name).
    Samples are written in ``order`` (the sample ids in the order a one-process run
    writes them), then any others in the order read; each sample's rows as written.
    The main file is replaced atomically before the shards are removed, so a kill in
    between leaves only duplicates, which every reader drops. Call it under the folder
    lock, after every writer has finished. Nothing happens if there are no shards.
    """
    main = Path(path)
    files = result_files(main)
    if all(f == main for f in files):
        return main
    samples: dict[str, list[str]] = {}
    seen: set = set()
    for f in files:
        per_file: dict[str, list[tuple[str, tuple]]] = {}
        for i, line in enumerate(complete_lines(f), 1):
            row = _parse(line, f, i)
            per_file.setdefault(row["sample_id"], []).append((line, _key(row)))
        for sample, items in per_file.items():
            if len({k for _, k in items}) < rows_per_sample:
                continue  # a write cut by a kill: the sample was (or will be) recomputed
            for line, k in items:
                if k not in seen:
                    seen.add(k)
                    samples.setdefault(sample, []).append(line)
    position = {s: i for i, s in enumerate(order)}
    ids = sorted(samples, key=lambda s: position.get(s, len(position)))
    atomic_write_lines(main, "".join(line + "\n" for s in ids for line in samples[s]))
    for f in files:
        if f != main:
            f.unlink(missing_ok=True)
    return main


class RowCounter:
    """How many complete rows were appended to a results file and its shards since this
    counter was made (reads only the new bytes; for the progress bar of a split run)."""

    def __init__(self, path):
        self.main = Path(path)
        self.offsets = {p: p.stat().st_size for p in result_files(self.main)}
        self.rows = 0

    def new_rows(self) -> int:
        for p in result_files(self.main):
            start = self.offsets.get(p, 0)
            try:
                with open(p, "rb") as f:
                    f.seek(start)
                    data = f.read()
            except OSError:
                continue
            if is_gzip(p):
                text, end = gzip_members(data)
            else:
                end = data.rfind(b"\n") + 1
                text = data[:end]
            self.rows += text.count(b"\n")
            self.offsets[p] = start + end
        return self.rows
