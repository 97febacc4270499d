"""Tidy results on disk: one JSON line per (sample, condition, measure), appended as each
sample finishes, so that an interrupted run resumes where it stopped.

Columns (:data:`COLUMNS`): ``model, dataset, metric, mode, rate, scope, layers,
sample_id, measure, value``. The clean run has ``metric="none", mode="clean",
rate=0``. Measures: ``nll``, ``ppl``, ``delta_ppl`` (language modelling); ``acc``,
``acc_norm``, ``gold_ll`` (multiple choice).

A sample's rows are written with one ``write`` and flushed to disk. On resume the file
is cut back to its last complete line and samples with fewer rows than expected (a
write cut by a kill) are dropped and recomputed. ``<name>.config.json`` beside the file
holds the run's configuration; resuming with another configuration is refused.
"""

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from cwlens.errors import CwlensError

COLUMNS = (
    "model", "dataset", "metric", "mode", "rate", "scope", "layers",
    "sample_id", "measure", "value",
)
CELL = ("dataset", "metric", "mode", "rate", "scope", "layers", "measure")


class ConfigMismatchError(CwlensError, ValueError):
    """Resuming into a results file made with another configuration."""


def _complete_lines(path: Path) -> list[str]:
    """The file's complete lines; a torn last line (no newline) is cut off the file."""
    if not path.exists():
        return []
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
    return data[:end].decode("utf-8").splitlines()


class ResultsWriter:
    """Append-only JSONL writer with resume (see the module docstring).

    Args:
        path: the ``.jsonl`` file.
        config: a JSON-able dict describing the run; must match on resume.
        rows_per_sample: how many rows a finished sample has.
        resume: keep finished samples (default); False starts the file afresh.
    """

    def __init__(self, path, config: dict, rows_per_sample: int, resume: bool = True):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.config_path = self.path.with_suffix(".config.json")
        self.rows_per_sample = rows_per_sample
        config = json.loads(json.dumps(config))
        if self.path.exists() and not resume:
            self.path.unlink()
        elif self.path.exists():
            old = json.loads(self.config_path.read_text()) if self.config_path.exists() else {}
            if old != config:
                diff = sorted(k for k in set(old) | set(config) if old.get(k) != config.get(k))
                raise ConfigMismatchError(
                    f"{self.path} was written with another configuration (differs in "
                    f"{', '.join(diff)}). Use another output path, or resume=False "
                    "(--no-resume) to start it afresh."
                )
        text = json.dumps(config, indent=1, sort_keys=True)
        if not (self.config_path.exists() and self.config_path.read_text() == text):
            self.config_path.write_text(text)  # unchanged: no write (read-only folders work)
        self.done = self._load_done()

    def _load_done(self) -> set[str]:
        lines = _complete_lines(self.path)
        counts: dict[str, int] = {}
        for line in lines:
            sid = json.loads(line)["sample_id"]
            counts[sid] = counts.get(sid, 0) + 1
        done = {s for s, c in counts.items() if c == self.rows_per_sample}
        if len(done) != len(counts):  # a sample cut mid-write: drop its rows
            kept = [ln for ln in lines if json.loads(ln)["sample_id"] in done]
            self.path.write_text("".join(ln + "\n" for ln in kept))
        return done

    def write_sample(self, rows: Sequence[dict]) -> None:
        """All rows of one finished sample, in one write, flushed and fsynced."""
        if len(rows) != self.rows_per_sample:
            raise ValueError(f"expected {self.rows_per_sample} rows, got {len(rows)}")
        text = "".join(json.dumps({c: r[c] for c in COLUMNS}) + "\n" for r in rows)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        self.done.add(rows[0]["sample_id"])


def read_results(paths: str | Path | Iterable[str | Path]):
    """A pandas DataFrame of every complete row in one or more ``.jsonl`` files."""
    import pandas as pd

    if isinstance(paths, (str, Path)):
        paths = [paths]
    rows = []
    for p in paths:
        p = Path(p)
        if not p.exists():
            raise FileNotFoundError(f"No results file {p}.")
        data = p.read_text(encoding="utf-8")
        lines = data.splitlines()
        if data and not data.endswith("\n"):
            lines = lines[:-1]  # torn last line of a killed run
        rows += [json.loads(ln) for ln in lines if ln.strip()]
    return pd.DataFrame(rows, columns=list(COLUMNS))


def bootstrap_ci(values, n_boot: int = 2000, level: float = 0.95, seed: int = 0):
    """``(low, high)`` percentile bootstrap interval of the mean."""
    import numpy as np

    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(n_boot, len(x)))].mean(1)
    a = (1 - level) / 2
    return float(np.quantile(means, a)), float(np.quantile(means, 1 - a))


def summarize(df, n_boot: int = 2000, level: float = 0.95, seed: int = 0):
    """Mean and bootstrap CI per cell (dataset, metric, mode, rate, scope, layers, measure)."""
    import pandas as pd

    out = []
    for key, group in df.groupby(list(CELL), sort=True, dropna=False):
        values = group.sort_values("sample_id")["value"].to_numpy()
        low, high = bootstrap_ci(values, n_boot, level, seed)
        out.append({**dict(zip(CELL, key, strict=True)), "n": len(values),
                    "mean": float(values.mean()), "ci_low": low, "ci_high": high})
    return pd.DataFrame(out, columns=[*CELL, "n", "mean", "ci_low", "ci_high"])
