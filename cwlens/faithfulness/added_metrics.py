"""Adding metrics to a finished run: only the new metrics are computed.

A metric's rows depend only on its own ranking (the tie-break is seeded by the run's seed
and the layer, the random control by the sample; the batches by the sample list), so a
run that lists more metrics than a finished one needs only the rows of the new ones: the
same numbers an uninterrupted run with every metric writes. :func:`metrics_already_done`
tells the sweep which metrics every sample already has; the sweep computes the rest and
appends their rows (the clean rows again: readers drop the duplicates).

The stored configuration is replaced by the new one before any row is added, so a run
killed while adding resumes the addition. Only ``metrics`` may differ, and only by
additions; the earlier run must be complete (else: finish it first, with its metrics).
"""

import json
from collections.abc import Sequence
from pathlib import Path

from cwlens.faithfulness.results import (
    ConfigMismatchError,
    config_path,
    read_config,
    read_results,
    result_files,
    same_config,
)
from cwlens.runs.results_io import atomic_write_text


def _complete(path, metrics: Sequence[str], sample_ids: Sequence[str], per_metric: int,
              clean_rows: int) -> set[str]:
    """The metrics of ``metrics`` whose rows every sample of ``sample_ids`` has in full
    (with the clean rows)."""
    table = read_results(path)
    if table.empty:
        return set()
    counts = table.groupby(["sample_id", "metric"]).size()
    wanted = set(sample_ids)
    have = {s for s in wanted if counts.get((s, "none"), 0) >= clean_rows}
    if have != wanted:
        return set()
    return {m for m in metrics if all(counts.get((s, m), 0) >= per_metric for s in wanted)}


def metrics_already_done(path, config: dict, metrics: Sequence[str], sample_ids: Sequence[str],
                         per_metric: int, clean_rows: int) -> set[str]:
    """The metrics of this run (``metrics``, in ``config``) that the results file ``path``
    already holds for every sample, where that is some of them but not all; else the
    empty set (a new run, an interrupted one, or nothing left to do).

    If the stored configuration is ``config`` with fewer metrics and every sample has all
    of their rows, the stored configuration is replaced by ``config`` first (the caller
    holds the folder's lock). Raises :class:`ConfigMismatchError` where the earlier run
    is not finished.
    """
    cfg_file = config_path(path)
    if not cfg_file.exists() or not result_files(path):
        return set()
    stored = read_config(cfg_file)
    config = json.loads(json.dumps(config))
    if same_config(stored, config):
        done = _complete(path, metrics, sample_ids, per_metric, clean_rows)
        return done if done != set(metrics) else set()
    differs = {k for k in set(stored) | set(config) if stored.get(k) != config.get(k)}
    old = stored.get("metrics") or []
    if differs != {"metrics"} or not set(old) < set(metrics):
        return set()  # another configuration: the writer refuses it, naming what differs
    done = _complete(path, old, sample_ids, per_metric, clean_rows)
    if done != set(old):
        raise ConfigMismatchError(
            f"{path} holds an unfinished run with the metrics {','.join(old)}; this run adds "
            f"{','.join(m for m in metrics if m not in old)}. Finish the earlier run first "
            "(rerun it with its own --metrics), then rerun this one: only the added metrics are "
            "computed. Or pass another output path, or --no-resume to start afresh.")
    atomic_write_text(Path(cfg_file), json.dumps(config, indent=1, sort_keys=True))
    return done
