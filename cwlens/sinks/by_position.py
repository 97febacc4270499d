"""What the sink tokens receive as a function of query position, per layer group (tables).

Input: :class:`~cwlens.reducers.KeySetResult` s from :func:`cwlens.stream_reduce` with
:class:`~cwlens.reducers.KeySetWeight` reducers (the first token; StreamingLLM's first
four). For each key set, metric and layer group (the early, middle and late thirds of the
model's layers), the token-level weight of each real query (heads combined as
:meth:`~cwlens.reducers.KeySetResult.token_level` does: attention rows and inter-head
contribution rows both sum to 1) is averaged over the group's layers, then the queries are
pooled in log-spaced bins of their position ``p = i + 1`` (the number of keys query ``i``
sees, counted from the row's first real token): per bin the mean and a quantile interval
over the bin's queries.
"""

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from cwlens.engine.reducers import KeySetResult
from cwlens.errors import InvalidArgumentError

GROUPS = ("early", "middle", "late")


def layer_groups(n_layers: int) -> dict[str, list[int]]:
    """The early, middle and late thirds of ``range(n_layers)`` (sizes differ by at most 1,
    the earlier groups larger); groups with no layer are left out."""
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise InvalidArgumentError(f"n_layers must be a positive int; got {n_layers!r}.")
    parts = np.array_split(np.arange(n_layers), len(GROUPS))
    return {g: [int(x) for x in part] for g, part in zip(GROUPS, parts, strict=True) if len(part)}


def log_bins(n: int, per_octave: int = 4) -> list[int]:
    """Edges ``e`` of log-spaced bins ``[e[k], e[k+1])`` covering positions ``1..n``:
    ``floor(2 ** (j / per_octave))`` without repeats, then ``n + 1``; a last bin less than
    half as wide as the one before joins it. The first bins hold one position each (until
    the spacing exceeds 1)."""
    for value, what in ((n, "n"), (per_octave, "per_octave")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"{what} must be a positive int; got {value!r}.")
    edges: list[int] = []
    j = 0
    while (e := int(np.floor(2 ** (j / per_octave) + 1e-9))) <= n:
        if not edges or e > edges[-1]:
            edges.append(e)
        j += 1
    if len(edges) >= 3 and 2 * (n + 1 - edges[-1]) < edges[-1] - edges[-2]:
        edges.pop()
    return edges + [n + 1]


def binned(values: torch.Tensor, positions: torch.Tensor, edges: Sequence[int],
           quantiles: tuple[float, float] = (0.1, 0.9)) -> list[dict]:
    """Per bin ``[edges[k], edges[k+1])`` of ``positions``: ``bin_lo``, ``bin_hi``
    (inclusive), ``position`` (the mean position), ``n_queries``, ``mean``, ``low``,
    ``high`` (the ``quantiles`` of the values in the bin, linear interpolation). Empty bins
    are left out. ``values``, ``positions``: 1-D, one entry per query."""
    lo_q, hi_q = quantiles
    if not 0 <= lo_q <= hi_q <= 1:
        raise InvalidArgumentError(f"quantiles must be 0 <= low <= high <= 1; got {quantiles!r}.")
    v = values.double().cpu().numpy()
    p = positions.cpu().numpy()
    rows = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        inside = (p >= lo) & (p < hi)
        if not inside.any():
            continue
        x = v[inside]
        rows.append({"bin_lo": int(lo), "bin_hi": int(hi) - 1, "position": float(p[inside].mean()),
                     "n_queries": int(inside.sum()), "mean": float(x.mean()),
                     "low": float(np.quantile(x, lo_q)), "high": float(np.quantile(x, hi_q))})
    return rows


def _per_query(result: KeySetResult, metric: str, layers: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, positions)`` of every real query: the token-level weight averaged over
    ``layers``, and ``p = i + 1`` counted from the row's first real token."""
    tok = result.token_level(metric)  # [layer, batch, query]
    rows = [result.layers.index(ly) for ly in layers]
    per_query = tok[rows].double().mean(0)  # [batch, query]
    real = result.query_mask.bool()
    first = real.int().argmax(-1, keepdim=True)
    pos = torch.arange(real.shape[1], device=real.device)[None] - first + 1
    return per_query[real], pos.expand_as(real)[real]


def position_curves(results: Mapping[str, KeySetResult], n_layers: int, metrics: Sequence[str] | None = None,
                    per_octave: int = 4, quantiles: tuple[float, float] = (0.1, 0.9)):
    """A long table: one row per key set (the name in ``results``), metric, layer group and
    position bin, with the columns of :func:`binned` plus ``key_set``, ``keys`` (the
    offsets, e.g. ``"0 1 2 3"``), ``metric``, ``group`` and ``layers`` (``"0-9"``).
    Groups are the thirds of ``n_layers`` (:func:`layer_groups`); a layer not streamed
    leaves its group's mean over the layers that were."""
    import pandas as pd  # heavy: pandas, imported on use

    rows = []
    for name, res in results.items():
        real = res.query_mask.bool()
        n = int(real.sum(-1).max())
        edges = log_bins(n, per_octave)
        for metric in metrics or tuple(res.weights):
            for group, members in layer_groups(n_layers).items():
                layers = [ly for ly in members if ly in res.layers]
                if not layers:
                    continue
                values, pos = _per_query(res, metric, layers)
                label = f"{layers[0]}-{layers[-1]}" if len(layers) > 1 else str(layers[0])
                for row in binned(values, pos, edges, quantiles):
                    rows.append({"key_set": name, "keys": " ".join(map(str, res.keys)),
                                 "metric": metric, "group": group, "layers": label, **row})
    return pd.DataFrame(rows)


def per_layer_means(results: Mapping[str, KeySetResult], metrics: Sequence[str] | None = None,
                    from_position: int = 1):
    """One row per key set, metric and layer: the mean token-level weight over the real
    queries at positions ``p >= from_position`` (``p = i + 1``)."""
    import pandas as pd  # heavy: pandas, imported on use

    rows = []
    for name, res in results.items():
        for metric in metrics or tuple(res.weights):
            for layer in res.layers:
                values, pos = _per_query(res, metric, [layer])
                keep = pos >= from_position
                rows.append({"key_set": name, "metric": metric, "layer": int(layer),
                             "from_position": from_position, "n_queries": int(keep.sum()),
                             "mean": float(values[keep].mean()) if keep.any() else float("nan")})
    return pd.DataFrame(rows)


def range_means(curves, start: int = 16, factor: int = 4):
    """A wide table of :func:`position_curves`: per key set, group and metric, the mean over
    the queries of the bins whose first position lies in ``[start, start * factor)``,
    ``[start * factor, start * factor**2)``, ... (columns named ``"16-63"``, ...): the bin
    means weighted by their query counts, so each cell is the plain mean over its queries."""
    import pandas as pd  # heavy: pandas, imported on use

    if start < 1 or factor < 2:
        raise InvalidArgumentError(f"range_means needs start >= 1 and factor >= 2; got {start}, {factor}.")
    top = int(curves.bin_hi.max()) if len(curves) else 0
    ranges = []
    lo = start
    while lo <= top:
        ranges.append((lo, lo * factor))
        lo *= factor
    rows = []
    for (key_set, group, metric), d in curves.groupby(["key_set", "group", "metric"], sort=False):
        row = {"key_set": key_set, "group": group, "metric": metric}
        for a, b in ranges:
            part = d[(d.bin_lo >= a) & (d.bin_lo < b)]
            label = f"{a}-{min(b, top + 1) - 1}"
            row[label] = float(np.average(part["mean"], weights=part.n_queries)) if len(part) else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)
