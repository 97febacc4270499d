"""Small summaries of per-entry measures, filled block by block by :func:`cwlens.stream_reduce`.

Pure torch. A reducer names the metrics it needs (``metrics``) and receives, for each
layer and each block of queries, ``{metric: [batch, head, block, key]}`` float32 tensors
(pad queries and keys are 0, and no reducer counts them: a padded batch gives each text
its single run's numbers). It keeps only what it reduces to, so memory stays small
whatever the sequence length:

=====================  ======================================================  ==========================
reducer                result                                                  size
=====================  ======================================================  ==========================
``TopK``               per row: the ``k`` largest entries (indices, values)     ``[layer, batch, head, query, k]``
``ColumnSums``         per key: summed over queries (what a token gives)       ``[layer, batch, head, key]``
``TokenLevel``         heads summed, full ``[query, key]`` for chosen layers  ``[layer, batch, query, key]``
``HeadSummary``        per head: sink rate, sink contribution, entropy, share  ``[layer, batch, head]``
``FullMatrices``       full ``[query, key]`` of a few ``(layer, head)``        ``{(layer, head, metric): ...}``
``KeySetWeight``       per query: the weight a key set receives (e.g. sinks)   ``{metric: [layer, batch, head, query]}``
=====================  ======================================================  ==========================

Every reducer's result equals the same reduction of the full tensors from
:mod:`cwlens.engine.measures` (tested). ``layers`` in a result lists the layers in the order of
its leading axis. ``TopK`` ranks only the keys a query attends to (never a pad key, a key
after the query on a decoder or outside a sliding window): a row with fewer keys than
``k`` ends in entries marked index -1 / value NaN (``TopKResult.valid``). Results with a
table have ``to_dataframe()`` (``TopKResult``, ``LayerTensor``, ``HeadSummaryResult``,
``KeySetResult``; ``StreamResult.to_dataframe(name)`` passes the batch's mask).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cwlens.core import metrics as _metrics
from cwlens.core.numerics import check_finite
from cwlens.core.sinks import key_contribution, query_after_sink
from cwlens.engine import validation
from cwlens.engine.adapter import _layer_index
from cwlens.engine.result_tables import keyset_table, layer_tensor_table, topk_table
from cwlens.engine.row_topk import allowed_keys, shared_row_topk
from cwlens.errors import CwlensError, InvalidArgumentError, LayerOutOfRangeError


class Reducer:
    """Base class: ``start_layer`` / ``update`` (once per query block) / ``end_layer`` / ``result``.

    Blocks of a layer may arrive in any order (the engine hands over the widest first):
    ``update`` gets each block's ``query_start``; reducers that keep rows put them back in
    query order (:func:`in_query_order`)."""

    name = "reducer"
    metrics: tuple[str, ...] = ()

    def start_layer(self, layer: int, geometry) -> None:  # noqa: B027 (optional hook)
        pass

    def update(self, layer: int, query_start: int, weights: dict[str, torch.Tensor], block) -> None:
        raise NotImplementedError

    def end_layer(self, layer: int, geometry) -> None:  # noqa: B027 (optional hook)
        pass

    def result(self):
        raise NotImplementedError

    def check(self, n_layers: int, n_heads: int, layers: Sequence[int], name: str) -> None:
        """Refuse, before the forward pass, what this model or these streamed ``layers``
        cannot give (``name``: the reducer's name in the run, for the message)."""

    def reset(self) -> None:
        """Forget what earlier runs accumulated (:func:`cwlens.stream_reduce` calls it first)."""
        for key, value in vars(self).items():
            if key.startswith("_") and isinstance(value, dict):
                value.clear()

    def release(self) -> None:
        """Free what :meth:`result` no longer needs (:func:`cwlens.stream_reduce` calls it
        right after ``result()``, one reducer at a time, so that the accumulated blocks of
        every reducer and every result never coexist). Default: keep everything."""


def _check_positive(value: object, what: str) -> int:
    return validation.positive_int(value, what)


def _check_metric(metric: object, what: str = "metric") -> str:
    if not isinstance(metric, str):
        raise InvalidArgumentError(f"{what} must be a metric name such as 'contribution'; got {metric!r}.")
    return _metrics.get(metric, _metrics.GEOMETRY).name  # what the streaming engine computes


def _resolve(layer: int, n_layers: int, name: str, what: str) -> int:
    if not -n_layers <= layer < n_layers:
        raise LayerOutOfRangeError(
            f"{name}: {what} {layer} is out of range: this model has {n_layers} layers "
            f"(0..{n_layers - 1}).")
    return layer % n_layers


def _streamed(layers: set[int], streamed: Sequence[int], name: str, what: str) -> None:
    missing = sorted(layers - set(streamed))
    if missing:
        raise LayerOutOfRangeError(
            f"{name}: {what} {missing} would not be streamed (layers={list(streamed)}): add "
            "them to stream_reduce(layers=...) or leave layers=None.")


@dataclass(frozen=True)
class TopKResult:
    """``indices`` (int32) and ``values`` ``[layer, batch, head or 1, query, k]``; rows sorted
    from the largest. ``head`` is 1 when heads were summed first (token level,
    ``summed_heads``). ``k`` is ``min(k, number of keys)``.

    Only keys the query attends to are results: never a pad key or a pad query's row, a
    key after the query on a decoder, or one outside a sliding window. Where a row has
    fewer such keys than ``k`` (on a decoder, query ``i`` has ``i + 1``), its last entries
    are marked with index **-1** and value **NaN**; :attr:`valid` is True on the others.
    ``to_dataframe()`` lists the valid entries only.
    """

    indices: torch.Tensor
    values: torch.Tensor
    layers: tuple[int, ...]
    metric: str
    summed_heads: bool = False
    by_abs: bool = False  # ranked by |value| (TopK(by_abs=True)); the values keep their sign

    @property
    def ranked_by(self) -> str:
        """What the rows are sorted by: the metric's value (``"contribution"``: the rule of
        every cwlens export and reducer) or, with ``by_abs``, its magnitude
        (``"|contribution|"``)."""
        return f"|{self.metric}|" if self.by_abs else self.metric

    @property
    def valid(self) -> torch.Tensor:
        """``[layer, batch, head or 1, query, k]`` bool: True on real entries (index >= 0)."""
        return self.indices >= 0

    def __repr__(self) -> str:  # shapes and the rule, not the lists
        axes = ("layer", "batch", "head", "query", "k")
        shape = ", ".join(f"{a} {n}" for a, n in zip(axes, self.indices.shape, strict=False))
        return (f"TopKResult(the {self.indices.shape[-1]} largest {self.ranked_by} of each row"
                f"{' (heads summed)' if self.summed_heads else ''}, layers {list(self.layers)}: "
                f".indices/.values [{shape}], -1/NaN where a row has fewer keys; "
                ".to_dataframe() lists them)")

    def to_dataframe(self, attention_mask: torch.Tensor | None = None):
        """Long table, one row per valid entry: ``layer, batch, head, query, rank, key,
        value`` (``head = -1``: heads summed). With ``attention_mask`` (a padded batch:
        ``cwlens.StreamResult.attention_mask``) ``query`` and ``key`` count from each
        text's first real token."""
        return topk_table(self, attention_mask)


class TopK(Reducer):
    """The ``k`` largest entries of each row (per head, or of the head sum with
    ``sum_heads=True``), by value: the rule of every cwlens reducer and export (a signed
    contribution's most negative keys are not among them; rank ``contribution_abs`` for
    the largest in magnitude). ``by_abs=True`` ranks by ``|w|`` instead (values keep their
    sign; :attr:`TopKResult.ranked_by` says ``|metric|``).

    Only the keys a query attends to are ranked: pad keys and pad queries, keys after the
    query on a decoder and keys outside a sliding window are never results; a row with
    fewer keys than ``k`` ends in entries marked index -1, value NaN
    (:attr:`TopKResult.valid`)."""

    def __init__(self, k: int = 8, metric: str = "contribution", by_abs: bool = False,
                 sum_heads: bool = False, name: str | None = None):
        self.k = _check_positive(k, "k")
        self.metric = _check_metric(metric)
        self.by_abs = validation.flag(by_abs, "by_abs")
        self.sum_heads = validation.flag(sum_heads, "sum_heads")
        self.metrics = (metric,)
        self.name = f"top{k}_{metric}" if name is None else validation.label(name, "name")
        self._idx: dict[int, list[tuple[int, torch.Tensor]]] = {}
        self._val: dict[int, list[tuple[int, torch.Tensor]]] = {}

    def update(self, layer, query_start, weights, block):
        n_keys = getattr(weights, "n_keys", None)
        # pad, causal, window: never results (computed only where torch ranks the block)
        allowed = lambda: allowed_keys(weights, block, query_start)  # noqa: E731
        if self.metric == "value_weighted_output_normalized" and not self.sum_heads and hasattr(weights, "kind"):
            # ||o|| is one positive constant per row (inter: per query, intra: per head and
            # query), so the row order is value_weighted's: rank that, then rescale
            idx, val = shared_row_topk(weights, "value_weighted", self.k, self.by_abs, False, n_keys,
                                       allowed)
            val = val * block.inverse_norm(weights.kind, 1)[..., None]
        else:
            idx, val = shared_row_topk(weights, self.metric, self.k, self.by_abs, self.sum_heads,
                                       n_keys, allowed)
        self._idx.setdefault(layer, []).append((query_start, idx.int()))
        self._val.setdefault(layer, []).append((query_start, val))

    def end_layer(self, layer, geometry):
        for store in (self._idx, self._val):
            if layer in store:
                store[layer] = [joined(store[layer], 2)]

    def check(self, n_layers, n_heads, layers, name):
        pass  # rows with fewer keys than k are marked -1 / NaN (see row_topk._row_topk)

    def result(self) -> TopKResult:
        layers = tuple(self._idx)
        return TopKResult(_layers_of_rows(self._idx, layers), _layers_of_rows(self._val, layers),
                          layers, self.metric, self.sum_heads, self.by_abs)

    def release(self) -> None:
        self.reset()  # the result is a copy: the per-block rows can go


@dataclass(frozen=True)
class LayerTensor:
    """A ``[layer, ...]`` tensor and the layers of its first axis; ``kind`` names the
    reducer that made it (``"column_sums"``: ``[layer, batch, (head,) key]``,
    ``"token_level"``: ``[layer, batch, query, key]``), which its shape alone cannot tell
    (a ``[layer, 1, head, key]`` column sum of a text with as many tokens as heads)."""

    tensor: torch.Tensor
    layers: tuple[int, ...]
    metric: str
    kind: str = ""

    def to_dataframe(self, attention_mask: torch.Tensor | None = None):
        """Long table, one row per number: ``layer, batch, head, key, value`` for column
        sums (``head = -1``: heads summed), ``layer, batch, query, key, value`` for the
        token level. With ``attention_mask`` (a padded batch:
        ``cwlens.StreamResult.attention_mask``) pad positions are left out and
        ``query`` and ``key`` count from each text's first real token."""
        return layer_tensor_table(self, attention_mask)


class ColumnSums(Reducer):
    """Per key, the sum over queries: ``[layer, batch, head, key]`` (``[layer, batch, key]``
    with ``sum_heads=True``). For the inter-head contribution, the head-summed column of
    key ``j`` is the total share of all outputs that token ``j`` supplies."""

    def __init__(self, metric: str = "contribution", sum_heads: bool = False, name: str | None = None):
        self.metric = _check_metric(metric)
        self.sum_heads = validation.flag(sum_heads, "sum_heads")
        self.metrics = (metric,)
        self.name = f"column_sums_{metric}" if name is None else validation.label(name, "name")
        self._acc: dict[int, torch.Tensor] = {}

    def update(self, layer, query_start, weights, block):
        s = _pattern_column_sums(weights, self.metric)  # (or the block's fused sums)
        if s is None:
            s = weights[self.metric].sum(2)
        if self.sum_heads:
            s = s.sum(1)
        s = _pad_keys(s, getattr(weights, "n_keys", None))
        self._acc[layer] = s if layer not in self._acc else self._acc[layer] + s

    def result(self) -> LayerTensor:
        layers = tuple(self._acc)
        return LayerTensor(torch.stack([self._acc[ly] for ly in layers]), layers, self.metric,
                           "column_sums")


class TokenLevel(Reducer):
    """Heads summed, full ``[batch, query, key]`` for the chosen ``layers`` (None: all;
    memory ``n^2`` per kept layer). For ``contribution`` (inter) rows sum to 1."""

    def __init__(self, layers: Sequence[int] | None = None, metric: str = "contribution",
                 name: str | None = None):
        self.asked = None if layers is None else validation.int_list(layers, "TokenLevel layers")
        self.keep = None if self.asked is None else set(self.asked)
        self.metric = _check_metric(metric)
        self.metrics = (metric,)
        self.name = f"token_{metric}" if name is None else validation.label(name, "name")
        self._rows: dict[int, list[tuple[int, torch.Tensor]]] = {}

    def check(self, n_layers, n_heads, layers, name):
        if self.asked is None:
            return
        self.keep = {_resolve(ly, n_layers, name, "layer") for ly in self.asked}
        _streamed(self.keep, layers, name, "layers")

    def update(self, layer, query_start, weights, block):
        if self.keep is None or layer in self.keep:
            rows = weights[self.metric].sum(1)
            rows = _pad_keys(rows, getattr(weights, "n_keys", None))
            self._rows.setdefault(layer, []).append((query_start, rows))

    def result(self) -> LayerTensor:
        layers = tuple(self._rows)
        if not layers:
            raise CwlensError(f"TokenLevel kept no layer: none of {sorted(self.keep or [])} was streamed.")
        return LayerTensor(torch.stack([in_query_order(self._rows[ly], 1) for ly in layers]),
                           layers, self.metric, "token_level")


@dataclass(frozen=True)
class HeadSummaryResult:
    """Per ``[layer, batch, head]``, means over the real queries strictly after the sink
    (the first real token; in a decoder its own query can only attend to itself), the
    convention and the names of :func:`cwlens.sinks.sink_statistics` (docs/sinks.md,
    "Columns"; tested equal):

    ``sink_rate``: attention on the sink; ``sink_contribution_intra``: its contribution
    weight to the head's own output ``c_i0^h`` (``o = o_i^h``); ``sink_contribution_inter``:
    its weight in the layer output (``o = o_i``; summed over heads, the sink token's share
    of the layer); ``entropy``: attention entropy (nats); ``output_share``: the head's
    share ``sum_j c_ij^h`` of the output under the run's ``kind`` (inter: of the layer
    output, sums to 1 over heads; intra: 1 wherever the head's output is non-zero).
    """

    sink_rate: torch.Tensor
    sink_contribution_intra: torch.Tensor
    sink_contribution_inter: torch.Tensor
    entropy: torch.Tensor
    output_share: torch.Tensor
    layers: tuple[int, ...]

    def to_dataframe(self, sample_ids: Sequence | None = None):
        import pandas as pd  # heavy: pandas, imported on use

        n_l, b, h = self.sink_rate.shape
        ids = list(range(b)) if sample_ids is None else list(sample_ids)
        rows = []
        for li, layer in enumerate(self.layers):
            for i in range(b):
                for j in range(h):
                    rows.append({"sample": ids[i], "layer": layer, "head": j,
                                 "sink_rate": float(self.sink_rate[li, i, j]),
                                 "sink_contribution_intra": float(self.sink_contribution_intra[li, i, j]),
                                 "sink_contribution_inter": float(self.sink_contribution_inter[li, i, j]),
                                 "entropy": float(self.entropy[li, i, j]),
                                 "output_share": float(self.output_share[li, i, j])})
        return pd.DataFrame(rows)


def _layers_of_rows(per_layer: dict[int, list[tuple[int, torch.Tensor]]], layers) -> torch.Tensor:
    """``[layer, batch, head, query, ...]`` from each layer's ``(query_start, rows)`` blocks,
    each block copied once into place (no per-layer concatenation first: at 16k tokens the
    top-k of every row of every layer is ~0.3 GB a reducer)."""
    if not layers:
        return torch.empty(0)
    blocks = per_layer[layers[0]]
    first = blocks[0][1]
    n_rows = sum(t.shape[2] for _, t in blocks)
    out = first.new_empty((len(layers), *first.shape[:2], n_rows, *first.shape[3:]))
    for i, ly in enumerate(layers):
        start0 = min(start for start, _ in per_layer[ly])
        for start, t in per_layer[ly]:
            out[i, :, :, start - start0 : start - start0 + t.shape[2]] = t
    return out


def in_query_order(blocks: list[tuple[int, torch.Tensor]], dim: int) -> torch.Tensor:
    """Concatenate ``(query_start, rows)`` blocks along the query axis ``dim`` in query order
    (the engine may hand blocks over in any order)."""
    return torch.cat([t for _, t in sorted(blocks, key=lambda b: b[0])], dim)


def joined(blocks: list[tuple[int, torch.Tensor]], dim: int) -> tuple[int, torch.Tensor]:
    """A finished layer's ``(query_start, rows)`` blocks as one: reducers that keep a few
    numbers per row join them when the layer ends, so that a layer's dozens of small block
    tensors do not outlive it (kept to the end they split the allocator's heap: the streamed
    pass of SmolLM2 at 8192 tokens, in 113-row blocks, peaked at 1338 MB kept and 830 MB
    joined; docs/benchmarks.md)."""
    return min(start for start, _ in blocks), in_query_order(blocks, dim)


_FROM_PATTERN = ("attention", "value_weighted", "value_weighted_output_normalized")


def _pattern_column_sums(weights, metric: str) -> torch.Tensor | None:
    """``[batch, head, key]`` column sums of the attention baselines straight from the
    block's pattern, without their ``[batch, head, query, key]`` tensors: ``sum_i a_ij``
    (shared, ``weights.derived``), times ``||v~_j||`` for the value-weighted one, and
    ``||v~_j|| sum_i a_ij / ||o_i||`` (one matrix-vector product) for the output-normalised
    one; None for other metrics or weights that carry no geometry (then the measure is
    summed). Equal to the sums of the measures up to float rounding (tests/test_stream.py)."""
    geo, kind = getattr(weights, "geometry", None), getattr(weights, "kind", None)
    cache = getattr(weights, "derived", None)
    if cache is not None and ("column_sums", metric) in cache:  # cwlens.engine.block_fused
        s = cache[("column_sums", metric)]
    elif metric not in _FROM_PATTERN or geo is None or kind is None or cache is None:
        return None
    elif metric == "value_weighted_output_normalized":
        inv = geo.inverse_norm(kind, 1)  # [batch, head or 1, query]
        s = torch.matmul(inv[:, :, None, :].to(geo.pattern.dtype), geo.pattern).squeeze(-2)
        s = s * geo.value_norm
    else:
        if "column_sums_attention" not in cache:
            cache["column_sums_attention"] = geo.pattern.sum(2)
        s = cache["column_sums_attention"]
        if metric == "value_weighted":
            s = s * geo.value_norm
    check_finite(s, f"the column sums of {metric}", getattr(geo, "layer", None), head_dim=1)
    return s


def _pad_keys(x: torch.Tensor, n_keys: int | None) -> torch.Tensor:
    """Zeros appended on the key axis (last) up to ``n_keys``."""
    if n_keys is None or x.shape[-1] >= n_keys:
        return x
    return torch.nn.functional.pad(x, (0, n_keys - x.shape[-1]))


def first_real(position_mask: torch.Tensor | None, batch: int, device) -> torch.Tensor:
    """Index of the first real token of each row ``[batch]`` (0 without a mask)."""
    if position_mask is None:
        return torch.zeros(batch, dtype=torch.long, device=device)
    return position_mask.to(device).int().argmax(-1)


class HeadSummary(Reducer):
    """Per-(layer, head) summaries: see :class:`HeadSummaryResult`."""

    metrics = ("attention", "contribution")

    def __init__(self, name: str = "heads"):
        self.name = validation.label(name, "name")
        self._acc: dict[int, dict[str, torch.Tensor]] = {}
        self._n: dict[int, torch.Tensor] = {}

    def update(self, layer, query_start, weights, block):
        a, c = weights["attention"], weights["contribution"]
        b, h, q, width = a.shape
        sink = first_real(block.position_mask, b, a.device)
        # the real queries after the sink (a block of pad queries may end before it)
        after = query_after_sink(sink, q, width, block.position_mask, query_start)  # [b, q]
        w = after[:, None, :].to(a.dtype)
        idx = sink.clamp_max(width - 1)[:, None, None, None].expand(b, h, q, 1)
        ent = -(a * torch.log(a.clamp_min(1e-30))).sum(-1)
        parts = {
            "sink_rate": a.gather(-1, idx)[..., 0],
            "sink_contribution_intra": key_contribution(block, sink, "intra").to(a.dtype),
            "sink_contribution_inter": key_contribution(block, sink, "inter").to(a.dtype),
            "entropy": ent,
            "output_share": c.sum(-1),
        }
        acc = self._acc.setdefault(layer, {})
        for key, val in parts.items():
            s = (val * w).sum(-1)
            acc[key] = s if key not in acc else acc[key] + s
        n = w.sum(-1)
        self._n[layer] = n if layer not in self._n else self._n[layer] + n

    def result(self) -> HeadSummaryResult:
        layers = tuple(self._acc)
        out = {}
        for key in ("sink_rate", "sink_contribution_intra", "sink_contribution_inter", "entropy",
                    "output_share"):
            out[key] = torch.stack([self._acc[ly][key] / self._n[ly].clamp_min(1) for ly in layers])
        return HeadSummaryResult(**out, layers=layers)


class FullMatrices(Reducer):
    """Full ``[batch, query, key]`` matrices of a few ``(layer, head)`` pairs, for each of
    ``metrics``: ``result()[(layer, head, metric)]``."""

    def __init__(self, pairs: Sequence[tuple[int, int]],
                 metrics: Sequence[str] = ("attention", "contribution"), name: str = "matrices"):
        self.asked = _pairs(pairs)
        self.pairs = list(self.asked)
        if isinstance(metrics, str) or not hasattr(metrics, "__iter__") or not list(metrics):
            raise InvalidArgumentError(
                f"metrics must be a non-empty list of metric names, e.g. ('attention', "
                f"'contribution'); got {metrics!r}.")
        self.metrics = tuple(_check_metric(m, "each of metrics") for m in metrics)
        if len(set(self.metrics)) != len(self.metrics):
            raise InvalidArgumentError(f"metrics lists a metric twice: {metrics!r}; give each once.")
        self.name = validation.label(name, "name")
        self._rows: dict[tuple[int, int, str], list[tuple[int, torch.Tensor]]] = {}

    def update(self, layer, query_start, weights, block):
        for ly, head in self.pairs:
            if ly == layer:
                for m in self.metrics:
                    rows = _pad_keys(weights[m][:, head], getattr(weights, "n_keys", None))
                    self._rows.setdefault((ly, head, m), []).append((query_start, rows.clone()))

    def check(self, n_layers, n_heads, layers, name):
        pairs = []
        for layer, head in self.asked:
            layer = _resolve(layer, n_layers, name, "layer of the pair")
            if not -n_heads <= head < n_heads:
                raise LayerOutOfRangeError(
                    f"{name}: head {head} of the pair ({layer}, {head}) is out of range: this "
                    f"model has {n_heads} heads per layer (0..{n_heads - 1}).")
            pairs.append((layer, head % n_heads))
        _streamed({ly for ly, _ in pairs}, layers, name, "the layers of the pairs")
        self.pairs = pairs

    def result(self) -> dict[tuple[int, int, str], torch.Tensor]:
        return {key: in_query_order(rows, 1) for key, rows in self._rows.items()}


def _pairs(pairs: object) -> list[tuple[int, int]]:
    """A non-empty list of ``(layer, head)`` int pairs, each once."""
    example = "e.g. [(0, 1), (1, 3)]"
    if isinstance(pairs, str | bytes) or not hasattr(pairs, "__iter__"):
        raise InvalidArgumentError(f"pairs must be a list of (layer, head) pairs, {example}; got {pairs!r}.")
    out = []
    for pair in pairs:
        items = list(pair) if isinstance(pair, tuple | list) else None
        ints = None if items is None or len(items) != 2 else [_layer_index(x) for x in items]
        if ints is None or None in ints:
            raise InvalidArgumentError(
                f"each of pairs must be a (layer, head) pair of integers, {example}; got {pair!r}.")
        out.append((int(ints[0]), int(ints[1])))  # type: ignore[arg-type]
    if not out:
        raise InvalidArgumentError(f"pairs is empty: pass at least one (layer, head) pair, {example}.")
    if len(set(out)) != len(out):
        raise InvalidArgumentError(f"pairs lists a pair twice: {pairs!r}; give each once.")
    return out

@dataclass(frozen=True)
class KeySetResult:
    """What a key set receives, per query. ``weights[metric]``: ``[layer, batch, head,
    query]``, the sum of that metric over the keys of the set (0 on pad queries);
    ``query_mask`` ``[batch, query]``: True on real queries; ``keys``: the set, as offsets
    from each row's first real token; ``kind``: the ``o`` the weights were projected on."""

    weights: dict[str, torch.Tensor]
    query_mask: torch.Tensor
    layers: tuple[int, ...]
    keys: tuple[int, ...]
    kind: str

    def to_dataframe(self):
        """Long table, one row per real query: ``layer, batch, head, query`` and one column
        per metric (pad queries left out; ``query`` counts from each text's first real token)."""
        return keyset_table(self)

    def token_level(self, metric: str) -> torch.Tensor:
        """``[layer, batch, query]``, heads combined so that a row is a share of one
        token-level distribution: the mean over heads for ``attention`` and for
        ``kind="intra"`` (each head's row sums to 1), else the sum (the inter-head
        contribution sums to 1 over heads and keys)."""
        if metric not in self.weights:
            raise CwlensError(f"This result has no {metric!r}; it holds {sorted(self.weights)}.")
        w = self.weights[metric]
        return w.mean(2) if metric == "attention" or self.kind == "intra" else w.sum(2)


class KeySetWeight(Reducer):
    """Per layer, head and query, the weight that a set of keys receives, for several
    metrics at once (``[batch, head, query]`` per layer and metric: linear in ``n``).

    ``keys``: offsets from each row's first real token (left padding shifts them with the
    row): ``(0,)`` is the first token, ``range(4)`` StreamingLLM's four sink tokens.
    Offsets past a row's end (or past a causal block's last key) contribute 0."""

    def __init__(self, keys: Sequence[int] = (0,), metrics: Sequence[str] = ("attention", "contribution"),
                 name: str | None = None):
        if isinstance(keys, str | bytes) or not hasattr(keys, "__iter__"):
            raise InvalidArgumentError(f"keys must be a list of offsets >= 0 from the first real "
                                       f"token, e.g. (0,) or range(4); got {keys!r}.")
        offsets = [_layer_index(k) for k in keys]  # ints, NumPy and 0-d torch integers
        if not offsets or any(k is None or k < 0 for k in offsets):
            raise InvalidArgumentError(f"keys must be offsets >= 0 from the first real token, "
                                       f"e.g. (0,) or range(4); got {tuple(keys)!r}.")
        keys = tuple(int(k) for k in offsets if k is not None)
        if len(set(keys)) != len(keys):
            raise InvalidArgumentError(f"keys {keys!r} repeats an offset (it would count twice).")
        self.keys = keys
        if isinstance(metrics, str):  # "attention" would be split into its letters
            raise InvalidArgumentError(f"metrics must be a list of metric names, e.g. "
                                       f"({metrics!r},); got the string {metrics!r}.")
        self.metrics = tuple(dict.fromkeys(_check_metric(m, "metrics") for m in metrics))
        if not self.metrics:
            raise InvalidArgumentError("KeySetWeight needs a metric, e.g. ('attention', 'contribution').")
        self.name = "keys_" + "_".join(map(str, keys)) if name is None else validation.label(name, "name")
        self._rows: dict[tuple[int, str], list[tuple[int, torch.Tensor]]] = {}
        self._seen: dict[str, Any] = {}  # the position mask, the kind, the first query

    def update(self, layer, query_start, weights, block):
        w = weights[self.metrics[0]]
        b, h, q, width = w.shape
        idx = first_real(block.position_mask, b, w.device)[:, None] + torch.tensor(self.keys, device=w.device)
        inside = idx < width  # [b, m]: keys past the block's last key have weight 0
        idx = idx.clamp_max(width - 1)[:, None, None, :].expand(b, h, q, -1)
        for metric in self.metrics:
            got = weights[metric].gather(-1, idx) * inside[:, None, None, :]
            self._rows.setdefault((layer, metric), []).append((query_start, got.sum(-1)))
        self._seen.update(mask=block.position_mask, kind=getattr(weights, "kind", "inter"),
                          start=min(query_start, self._seen.get("start", query_start)))

    def end_layer(self, layer, geometry):
        for metric in self.metrics:
            if (layer, metric) in self._rows:
                self._rows[(layer, metric)] = [joined(self._rows[(layer, metric)], 2)]

    def result(self) -> KeySetResult:
        layers = tuple(dict.fromkeys(layer for layer, _ in self._rows))
        if not layers:
            raise CwlensError("KeySetWeight got no block: no layer was streamed.")
        out = {m: torch.stack([in_query_order(self._rows[(ly, m)], 2) for ly in layers])
               for m in self.metrics}
        _, b, _, q = out[self.metrics[0]].shape
        mask, start = self._seen["mask"], self._seen["start"]
        device = out[self.metrics[0]].device
        real = torch.ones(b, q, dtype=torch.bool, device=device) if mask is None \
            else mask[:, start : start + q].to(device)
        return KeySetResult(out, real, layers, self.keys, self._seen["kind"])
