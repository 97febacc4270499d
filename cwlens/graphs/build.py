"""``cwlens.graph``: a text's contribution graph, built by the streaming engine.

One reducer (:class:`GraphEdges`) per metric receives each layer's query blocks from
:func:`cwlens.stream_reduce` and keeps, per node, its top incoming edges
(:func:`cwlens.graphs.edges_math.block_edges`): memory beyond the forward pass is a few
blocks plus ``layers x positions x (top_k + 1) x heads`` floats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from cwlens.engine import validation
from cwlens.engine.adapter import Layers
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle
from cwlens.engine.reducers import Reducer, in_query_order
from cwlens.engine.row_topk import allowed_keys
from cwlens.engine.streaming import check_metric, pass_options, stream_reduce
from cwlens.engine.tokens import token_ids
from cwlens.errors import InvalidArgumentError
from cwlens.graphs import edges_math
from cwlens.graphs.result import ContributionGraph

#: heads of each edge whose factor split (attention x relative norm x cosine) is kept
FACTOR_HEADS = 3
_KEYS = ("from_position", "weight", "heads", "residual", "attention", "head_share",
         "factor_heads", "factors")


class GraphEdges(Reducer):
    """The graph's edges under one ``metric`` (inter-head), block by block: see
    :func:`cwlens.graphs.edges_math.block_edges`. For the contribution, also the factor
    split of each edge's :data:`FACTOR_HEADS` largest heads."""

    def __init__(self, metric: str = "contribution", top_k: int = 8, name: str | None = None):
        self.metric = check_metric(metric)
        self.top_k = validation.positive_int(top_k, "top_k")
        self.factored = self.metric == "contribution"
        self.metrics = (self.metric, "attention") if self.factored else (self.metric,)
        self.name = f"graph_{self.metric}" if name is None else name
        self._rows: dict[int, list[tuple[int, dict[str, torch.Tensor]]]] = {}

    def update(self, layer, query_start, weights, block):
        w = weights[self.metric][0]  # [head, q, width]: one text
        resid, b_O, _ = block.require_residual("cwlens.graph (the residual's share)")
        attn = block.layer_output + b_O  # what attention adds, b_O included: [1, q, d]
        s_res, s_att = edges_math.residual_shares(resid[0].to(attn.dtype), attn[0])
        allowed = allowed_keys(weights, block, query_start)
        allowed = None if allowed is None else allowed[0, 0]
        out = edges_math.block_edges(w, self.metric, s_res.to(w.dtype), s_att.to(w.dtype),
                                     query_start, self.top_k, allowed)
        if self.factored:
            self._factors(out, weights, block, w)
        self._rows.setdefault(layer, []).append((query_start, out))

    def _factors(self, out: dict, weights, block, c: torch.Tensor) -> None:
        """The factor split of each edge's largest heads (``out["factors"]``)."""
        heads = out["heads"]  # [q, K, h]
        top = edges_math.largest_heads(heads, FACTOR_HEADS)  # [q, K, m]
        q, K, m = top.shape
        src = out["from_position"].clamp(0, c.shape[-1] - 1)  # [q, K]
        rows = torch.arange(q, device=c.device)[:, None, None].expand(q, K, m)
        keys = src[:, :, None].expand(q, K, m)
        a = weights["attention"][0][top, rows, keys]
        cw = c[top, rows, keys]
        vn = block.value_norm[0][top, keys]
        on = block.output_norm("inter")[0, 0][rows]
        out["factor_heads"] = top
        out["factors"] = edges_math.factor_split(a, cw, vn, on.to(a.dtype))

    def end_layer(self, layer, geometry):
        if layer in self._rows:  # one tensor per key, not one per block
            blocks = self._rows[layer]
            self._rows[layer] = [(0, {
                key: in_query_order([(s, d[key]) for s, d in blocks], 0)
                for key in blocks[0][1]})]

    def result(self) -> dict[str, Any]:
        layers = sorted(self._rows)
        out: dict[str, Any] = {"blocks": tuple(layers)}
        for key in _KEYS:  # one key at a time, its per-layer tensors dropped once stacked
            if key in self._rows[layers[0]][0][1]:
                out[key] = torch.stack([self._rows[ly][0][1].pop(key) for ly in layers]).cpu().numpy()
        return out

    def release(self) -> None:
        self.reset()


@takes_model
def graph(model: ModelLike, text, metric: str = "contribution", top_k: int = 8,
          layers: Layers = None, compare: str | None = "attention", **options) -> ContributionGraph:
    """The contribution graph of one text: nodes ``(layer, position)`` for layer ``0 ..
    n_layers`` (0: the token embeddings, ``l``: the residual stream after the ``l``-th
    block), and into each node of layer ``l`` its ``top_k`` strongest edges from layer
    ``l - 1`` plus the self edge.

    An edge ``(l-1, j) -> (l, i)`` carries block ``l``'s token-level weight of key ``j`` at
    query ``i`` under ``metric`` (inter-head: heads summed; rows scaled to sum to 1 where
    the metric's do not), times the attention's share of the stream ``s_att``; the self
    edge also carries the residual's own share ``s_res`` (``s_res + s_att = 1``, so every
    node's full row of weights sums to 1: :mod:`cwlens.graphs.edges_math`). For the
    contribution the weights are those of ``cwlens.circuits.token_flow(...,
    rule="signed").layer_flows``. Each edge keeps its per-head split and, for the
    contribution, the factor split (attention x relative norm x cosine) of its largest heads.

    Built by the streaming engine in one forward pass (:func:`cwlens.stream_reduce`):
    only the top edges of each node are kept, so memory stays a few query blocks plus
    the edges, at any length (``attention="blockwise"`` above 2048 tokens by default).

    Args:
        model: the TransformerLens model.
        text: one text (a string) or its token ids ``[pos]`` / ``[1, pos]``.
        metric: the metric that splits attention over keys and heads: ``contribution``,
            ``attention``, ``value_weighted``, ``value_weighted_output_normalized``,
            ``contribution_abs`` or ``alti``.
        top_k: edges kept per node besides the self edge.
        layers: the model's blocks whose edges to build (an int, a list, None: all).
        compare: a second metric built in the same pass (``g.compare``; the viewer shows
            both side by side on one layout), or None.
        **options: the forward pass's ``attention`` and ``query_block`` (see
            :func:`cwlens.stream_reduce`).

    Returns:
        A ``ContributionGraph`` (``.node(layer, position)``, ``.to_pandas()``,
        ``.routes(target, threshold)``, ``.show()``, ``.save(path)``).

    Examples:
        >>> import cwlens
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> g = cwlens.graph(model, "the cat sat on the mat", top_k=3)
        >>> g.n_positions, g.layers, g.compare.metric
        (7, (1, 2), 'attention')
        >>> row = g.node(2, -1)[0]  # the self edge of the last position, after block 2
        >>> sorted(row)[:5]
        ['factors', 'from_layer', 'from_position', 'from_token', 'heads']
        >>> round(sum(row["heads"]) + row["residual"] - row["weight"], 6)
        0.0
    """
    run = pass_options("graph", {"query_block": "auto", **options}, ("attention", "query_block"))
    tokens = _tokens(model, text)
    metrics = [check_metric(metric)]
    if compare is not None:
        other = check_metric(compare)
        if other == metrics[0]:
            raise InvalidArgumentError(f"compare={compare!r} is the metric itself; pass another "
                                       "metric (e.g. 'attention') or compare=None.")
        metrics.append(other)
    reducers = [GraphEdges(m, top_k) for m in metrics]
    res = stream_reduce(model, tokens, reducers, layers=layers, query_block=run["query_block"],
                        attention=run["attention"], logits=False)
    return assemble(res, reducers, _str_tokens(model, tokens[0]), str(model.name or ""))


def assemble(results, reducers: Sequence[GraphEdges], tokens: Sequence[str], model_name: str = ""
             ) -> ContributionGraph:
    """The graph from a :func:`cwlens.stream_reduce` result holding one or two
    :class:`GraphEdges` reducers' results (the second becomes ``compare``): for callers that
    run the graph's reducers in a pass of their own (``cwlens analyze``'s report)."""
    graphs = [_graph(results[r.name], r.metric, r.top_k, tokens, model_name) for r in reducers]
    return graphs[0] if len(graphs) == 1 else replace(graphs[0], compare=graphs[1])


def _tokens(handle: ModelHandle, text) -> torch.Tensor:
    """``[1, pos]`` token ids of one text (a string, or ids ``[pos]`` / ``[1, pos]``)."""
    if isinstance(text, str):
        validation.text(text)
        return token_ids(handle, text, truncate=False).reshape(1, -1)
    if isinstance(text, torch.Tensor) and text.ndim in (1, 2) and (text.ndim == 1 or text.shape[0] == 1):
        return text.reshape(1, -1)
    raise InvalidArgumentError(
        f"cwlens.graph takes one text (a string) or its token ids [pos] / [1, pos]; got "
        f"{type(text).__name__}{tuple(text.shape) if isinstance(text, torch.Tensor) else ''}. "
        "For several texts, build one graph each.")


def _str_tokens(handle: ModelHandle, ids: torch.Tensor) -> tuple[str, ...]:
    if hasattr(handle.model, "to_str_tokens"):
        return tuple(str(t) for t in handle.to_str_tokens(ids))
    return tuple(str(t) for t in handle.tokenizer.convert_ids_to_tokens(ids.tolist()))  # HookedEncoder


def _graph(parts: dict[str, Any], metric: str, top_k: int, tokens: Sequence[str], name: str
           ) -> ContributionGraph:
    return ContributionGraph(
        tokens=tuple(tokens), metric=metric, blocks=parts["blocks"], top_k=top_k,
        from_position=parts["from_position"].astype(np.int32, copy=False),
        weight=parts["weight"].astype(np.float32, copy=False), heads=parts["heads"].astype(np.float32, copy=False),
        residual=parts["residual"].astype(np.float32, copy=False), attention=parts["attention"].astype(np.float32, copy=False),
        head_share=parts["head_share"].astype(np.float32, copy=False),
        factor_heads=None if "factor_heads" not in parts else parts["factor_heads"].astype(np.int16, copy=False),
        factors=None if "factors" not in parts else parts["factors"].astype(np.float32, copy=False),
        model_name=name)
