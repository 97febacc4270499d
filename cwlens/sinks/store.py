"""The sink analysis on disk: the table files (:data:`TABLES`), the resumable store of
finished batches (:class:`RawStore`), and the tables written with a checksum manifest.

Every table carries the dataset sample id.
"""

import hashlib
import json
from pathlib import Path

import pandas as pd

from cwlens.errors import CwlensError
from cwlens.runs.results_io import atomic_write, atomic_write_text

TABLES = {
    "stats": "sink_stats.csv",  # per sample, layer, head
    "heads": "sink_heads.csv",  # per layer, head (mean over samples)
    "layers": "sink_layers.csv",  # per layer
    "alignment": "alignment.csv",  # per sample, layer, head
    "histograms": "alignment_histograms.csv",  # per layer, measure, bin
    "alignment_layers": "alignment_layers.csv",  # per layer, measure
    "sweep": "sweep.csv",  # per sample, layer, head (head -1: layer output)
    "curves": "sweep_curves.csv",  # per layer, head, s (mean curve)
    "ppl": "ppl.csv",  # per sample, target, scale
    "ppl_summary": "ppl_summary.csv",  # per target, scale
    "norm": "norm_intervention.csv",  # per target, scale, layer
    "observed": "observed_bins.csv",  # per layer, head, sink-rate bin (sufficient sums)
    "observed_heads": "observed_heads.csv",  # per layer, head: quadratic fit, minimum
    "observed_layers": "observed_layers.csv",  # per layer: pooled relative-norm fit
}


RAW_PARTS = ("stats", "alignment", "histograms", "sweep", "curves", "observed", "ppl", "norm")
RAW_DIR = "raw"  # <out>/raw/batch-00000.json: one file per finished batch
MANIFEST = "tables.json"  # written after every table: {file name: sha256}


class SinkResultsError(CwlensError, ValueError):
    """A sinks results folder that is incomplete, corrupt, or from another configuration."""


# -- column names of tables written before the names were made explicit ----------------------
_SPLIT = ("attention", "relative_norm", "cosine", "contribution")
#: old column -> new column (``sink_contribution`` is handled by :func:`upgrade_columns`).
RENAMED = {"sink_contribution_median": "sink_contribution_intra_median",
           **{f"sink_{f}": f"split_sink_{f}" for f in _SPLIT if f != "contribution"},
           **{f"tail_{f}": f"split_tail_{f}" for f in _SPLIT}}


def upgrade_columns(df: pd.DataFrame) -> pd.DataFrame:
    """A sink table with the old column names (before #39.6) under the current ones.

    The old ``sink_contribution`` of a per-head table was the factor split's value, which
    ``cwlens sinks`` (``kind="intra"``, one sink token) made equal to the intra-head sink
    contribution: it becomes ``sink_contribution_intra`` and ``split_sink_contribution``;
    in the per-layer table it was the split's mean alone (``split_sink_contribution``).
    The factor split's ``sink_*`` / ``tail_*`` become ``split_sink_*`` / ``split_tail_*``.
    A table with the current names is returned unchanged. Values are never changed.
    """
    cols = list(df.columns)
    if "sink_contribution" not in cols:
        return df
    per_head = "sink_contribution_inter" in cols
    new = {c: RENAMED.get(c, c) for c in cols}
    new["sink_contribution"] = "sink_contribution_intra" if per_head else "split_sink_contribution"
    out = df.rename(columns=new)
    if per_head and "split_tail_contribution" in out.columns:
        out.insert(list(out.columns).index("split_tail_contribution"), "split_sink_contribution",
                   out["sink_contribution_intra"])
    return out


def upgrade_folder(out_dir) -> list[Path]:
    """Rewrite the sink tables of a finished run (``sink_stats.csv``, ``sink_heads.csv``,
    ``sink_layers.csv``) with the current column names (:func:`upgrade_columns`) and
    update the checksums in ``tables.json``; every value is copied as the text it was
    stored as. Returns the files rewritten (none if they already had the current names).
    ``python scripts/upgrade_sink_tables.py <folder>...`` runs it."""
    out = Path(out_dir)
    manifest = out / MANIFEST
    sums = json.loads(manifest.read_text()) if manifest.exists() else None
    done = []
    for key in ("stats", "heads", "layers"):
        path = out / TABLES[key]
        if not path.exists():
            continue
        old = pd.read_csv(path, dtype=str, keep_default_na=False)
        new = upgrade_columns(old)
        if new is old:
            continue
        if sums is not None and sums.get(path.name) != _sha256(path):
            raise SinkResultsError(f"{path} changed since the run wrote it (its checksum in "
                                   f"{manifest} differs): not upgrading it.")
        atomic_write(path, _csv_writer(new))
        if sums is not None:
            sums[path.name] = _sha256(path)
        done.append(path)
    if done and sums is not None:
        atomic_write_text(manifest, json.dumps(sums, indent=1))
    return done


def _frame_to_json(df: pd.DataFrame) -> dict:
    """Exact JSON form of a table: Python floats are written with repr (round trip)."""
    return {"columns": list(df.columns), "dtypes": [str(d) for d in df.dtypes],
            "data": [df[c].tolist() for c in df.columns]}


def _frame_from_json(obj: dict) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(v, dtype=d) for c, d, v in
                         zip(obj["columns"], obj["dtypes"], obj["data"], strict=True)})


def _samples_said(old: dict, new: dict) -> str:
    """What a changed ``samples`` list means (--dataset, --samples): its ids' datasets and count."""
    a, b = old.get("samples"), new.get("samples")
    if a == b or not isinstance(a, list) or not isinstance(b, list):
        return ""

    def said(ids: list) -> str:
        names = sorted({str(i).rsplit("-", 1)[0] for i in ids})
        return f"{len(ids)} texts of {', '.join(names)}"

    return f": the stored run has {said(a)}, this one {said(b)}"


class RawStore:
    """``<out>/raw/``: ``config.json`` and one ``batch-<k>.json`` per finished batch
    (written atomically: a batch is done iff its file exists). Batches are fixed by the
    configuration, so a resumed run computes exactly the numbers of an uninterrupted one.
    Files of separate batches never collide, so processes can share the folder, each
    taking its own batches."""

    def __init__(self, out_dir, config: dict, resume: bool = True):
        self.dir = Path(out_dir) / RAW_DIR
        self.config = json.loads(json.dumps(config))
        cfg_path = self.dir / "config.json"
        if self.dir.exists() and not resume:
            for p in self.dir.glob("*.json"):
                p.unlink()
        elif cfg_path.exists():
            try:
                old = json.loads(cfg_path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise SinkResultsError(
                    f"{cfg_path} is not readable JSON ({e}): it records the configuration of "
                    "the batches beside it. Restore it, or use another --out, or --no-resume "
                    "to start afresh.") from None
            if old != self.config:
                diff = sorted(k for k in set(old) | set(self.config) if old.get(k) != self.config.get(k))
                raise SinkResultsError(
                    f"{out_dir} holds a sinks run with another configuration (differs in "
                    f"{', '.join(diff)}{_samples_said(old, self.config)}). Use another --out, "
                    "or --no-resume to start it afresh.")
        self.dir.mkdir(parents=True, exist_ok=True)
        if not cfg_path.exists() or json.loads(cfg_path.read_text()) != self.config:
            atomic_write_text(cfg_path, json.dumps(self.config, indent=1, sort_keys=True))

    def path(self, bi: int) -> Path:
        return self.dir / f"batch-{bi:05d}.json"

    def done(self, bi: int, ids) -> bool:
        p = self.path(bi)
        if not p.exists():
            return False
        try:
            return json.loads(p.read_text())["ids"] == list(ids)
        except (ValueError, KeyError):
            return False  # unreadable: recompute it

    def write(self, bi: int, ids, parts: dict[str, pd.DataFrame]) -> None:
        obj = {"batch": bi, "ids": list(ids), "parts": {k: _frame_to_json(v) for k, v in parts.items()}}
        atomic_write_text(self.path(bi), json.dumps(obj))

    def load(self, n_batches: int) -> dict[str, list[pd.DataFrame]]:
        parts: dict[str, list[pd.DataFrame]] = {k: [] for k in RAW_PARTS}
        for bi in range(n_batches):
            obj = json.loads(self.path(bi).read_text())
            for k, v in obj["parts"].items():
                parts[k].append(upgrade_columns(_frame_from_json(v)))
        return parts


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _csv_writer(df: pd.DataFrame):
    def write(tmp: Path) -> None:
        df.to_csv(tmp, index=False)

    return write


def save_tables(tables: dict[str, pd.DataFrame], out_dir) -> list[Path]:
    """Write every table atomically; ``tables.json`` (their checksums) is removed first and
    written last, so a folder with a valid manifest holds one complete set of tables."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in (MANIFEST, "summary.json"):
        (out / name).unlink(missing_ok=True)
    for key, name in TABLES.items():  # an earlier run's tables that this one does not write
        if key not in tables:         # (e.g. the intervention's, after --no-intervention)
            (out / name).unlink(missing_ok=True)
    paths = []
    for key, name in TABLES.items():
        if key in tables:
            atomic_write(out / name, _csv_writer(tables[key]))
            paths.append(out / name)
    atomic_write_text(out / MANIFEST, json.dumps({p.name: _sha256(p) for p in paths}, indent=1))
    return paths


def load_tables(out_dir) -> dict[str, pd.DataFrame]:
    """The tables of a finished run; :class:`SinkResultsError` (what is wrong, and that
    rerunning the same ``cwlens sinks`` command finishes it) if the folder holds no
    complete, intact set."""
    out = Path(out_dir)
    rerun = ("Rerun the `cwlens sinks` command that wrote it (it resumes from the saved "
             "batches and rewrites the tables), or point --out at a finished run.")
    manifest = out / MANIFEST
    if manifest.exists():
        try:
            sums = json.loads(manifest.read_text())
        except ValueError:
            raise SinkResultsError(f"{manifest} is corrupt. {rerun}") from None
        bad = [n for n, h in sums.items() if not (out / n).exists() or _sha256(out / n) != h]
        if bad:
            raise SinkResultsError(f"{out}: tables {', '.join(bad)} are missing or changed since the "
                                   f"run wrote them. {rerun}")
        names = {k: n for k, n in TABLES.items() if n in sums}
    elif (out / RAW_DIR).exists():
        raise SinkResultsError(f"{out} holds an unfinished sinks run (no {MANIFEST}). {rerun}")
    else:  # tables written before the manifest existed
        names = {k: n for k, n in TABLES.items() if (out / n).exists()}
    missing = [TABLES[k] for k in ("stats", "heads", "layers", "sweep", "curves", "histograms")
               if k not in names]
    if missing:
        raise SinkResultsError(f"{out} has no sink tables {', '.join(missing)}. {rerun}")
    tables = {}
    for k, n in names.items():
        try:
            tables[k] = upgrade_columns(pd.read_csv(out / n))
        except (pd.errors.EmptyDataError, pd.errors.ParserError, UnicodeDecodeError) as e:
            raise SinkResultsError(f"{out / n} is empty or corrupt ({e}). {rerun}") from None
    return tables
