"""The :class:`ContributionGraph` that :func:`cwlens.graph` returns: NumPy arrays of the
top incoming edges of every node, with tables, routes and the HTML viewer."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from cwlens.errors import InvalidArgumentError, LayerOutOfRangeError
from cwlens.graphs import viewer
from cwlens.graphs.routes import route_mask

FACTORS = ("attention", "relative_norm", "cosine")


@dataclass(frozen=True, repr=False, eq=False)  # (arrays: no elementwise ==)
class ContributionGraph:
    """A text's contribution graph, what :func:`cwlens.graph` returns.

    Nodes ``(layer, position)`` (layer 0: the token embeddings; layer ``l``: the
    residual stream after the ``l``-th block, i.e. block ``l - 1`` counted from 0) and, into each node of layer ``l``, its top edges from layer ``l - 1``
    (:mod:`cwlens.graphs.edges_math`: the layer's token-level weight of each key, heads
    summed, scaled by the attention's share, plus the residual's own share on the self edge).

    Arrays have a leading ``block`` axis, one entry per streamed layer (``blocks``: the
    model's block indices; their edges end in node layer ``block + 1``) and ``slot`` axis:
    slot 0 is the self edge ``(l-1, i) -> (l, i)``, slots ``1 ..`` the strongest other
    keys by ``|weight|`` (-1 / NaN where a node has fewer).

    Attributes:
        tokens: the text's tokens, one per position.
        metric: the metric that splits attention over keys and heads.
        blocks: the model's blocks (0-based) whose edges the graph holds.
        from_position: ``[block, pos, slot]`` int32, -1: no edge.
        weight: ``[block, pos, slot]`` float32.
        heads: ``[block, pos, slot, head]`` float32: each head's part of the edge (the
            residual share is in no head: ``weight = residual (self edge) + sum(heads)``).
        residual: ``[block, pos]``: the residual's own share ``s_res``.
        attention: ``[block, pos]``: the attention's share ``s_att = 1 - s_res``.
        head_share: ``[block, pos, head]``: each head's share of the layer's attention output.
        factor_heads: ``[block, pos, slot, m]`` the ``m`` largest heads of each edge
            (contribution only; else None).
        factors: ``[block, pos, slot, m, 3]``: their ``(attention, relative_norm, cosine)``.
        compare: the same graph under another metric (same text, same pass), or None.
        keep: ``[block, pos, slot]`` bool: the edges of a :meth:`routes` subgraph (None: all).

    Examples:
        >>> import cwlens
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> g = cwlens.graph(model, "when mary and john went to the store", top_k=2)
        >>> df = g.to_pandas()  # one row per edge
        >>> list(df.columns[:8])
        ['layer', 'position', 'token', 'from_layer', 'from_position', 'from_token', 'rank', 'weight']
        >>> r = g.routes(target=-1, threshold=0.04)  # Ferrando & Voita's routes to the last token
        >>> bool((r.to_pandas().weight >= 0.04).all())
        True
    """

    tokens: tuple[str, ...]
    metric: str
    blocks: tuple[int, ...]
    top_k: int
    from_position: np.ndarray
    weight: np.ndarray
    heads: np.ndarray
    residual: np.ndarray
    attention: np.ndarray
    head_share: np.ndarray
    factor_heads: np.ndarray | None = None
    factors: np.ndarray | None = None
    compare: ContributionGraph | None = None
    keep: np.ndarray | None = None
    route: dict[str, Any] | None = field(default=None)
    model_name: str = ""

    # -- shape --------------------------------------------------------------------------
    @property
    def n_positions(self) -> int:
        return len(self.tokens)

    @property
    def n_heads(self) -> int:
        return int(self.heads.shape[-1])

    @property
    def layers(self) -> tuple[int, ...]:
        """The node layers that have incoming edges (``block + 1`` for each block)."""
        return tuple(b + 1 for b in self.blocks)

    @property
    def valid(self) -> np.ndarray:
        """``[block, pos, slot]`` bool: the edges that exist (and, for a routes
        subgraph, lie on a route)."""
        ok = self.from_position >= 0
        return ok if self.keep is None else ok & self.keep

    def __repr__(self) -> str:
        b = len(self.blocks)
        n_edges = int(self.valid.sum())
        more = f", compare={self.compare.metric!r}" if self.compare is not None else ""
        route = "" if self.route is None else (
            f", routes to position {self.route['target']} at threshold {self.route['threshold']}")
        return (f"ContributionGraph(metric={self.metric!r}, {self.n_positions} positions, "
                f"{b} layers of edges, top_k={self.top_k}, {n_edges} edges, {self.n_heads} heads"
                f"{more}{route}; .node(layer, position), .to_pandas(), .routes(), .show())")

    # -- reading ------------------------------------------------------------------------
    def _block_of(self, layer: int) -> int:
        layer = _int(layer, "layer")
        if layer not in self.layers:
            raise LayerOutOfRangeError(
                f"node layer {layer} has no incoming edges in this graph: its layers with edges "
                f"are {list(self.layers)} (node layer 0 is the embeddings; layer l is after "
                f"block l - 1, 0-based).")
        return self.layers.index(layer)

    def _position(self, position: int) -> int:
        position = _int(position, "position")
        n = self.n_positions
        if not -n <= position < n:
            raise InvalidArgumentError(f"position {position} is out of range: the text has {n} "
                                       f"positions (0..{n - 1}, or negative from the end).")
        return position % n

    def node(self, layer: int, position: int) -> list[dict[str, Any]]:
        """The incoming edges of node ``(layer, position)``, strongest first (the self
        edge first: it carries the residual's own share), as dicts with ``from_layer``,
        ``from_position``, ``weight``, ``heads`` (a list, one float per head),
        ``residual`` (the residual share; 0 on other edges), ``rank`` (0: the self
        edge), ``from_token`` and, for the contribution, ``factors``: the edge's
        largest heads as dicts ``head, weight, attention, relative_norm, cosine``.
        The viewer's side panel shows the same rows (``window.cwlensGraph.select``)."""
        b, i = self._block_of(layer), self._position(position)
        rows = []
        valid = self.valid[b, i]
        for s in range(self.from_position.shape[2]):
            if not valid[s]:
                continue
            j = int(self.from_position[b, i, s])
            row: dict[str, Any] = {
                "from_layer": layer - 1, "from_position": j, "weight": float(self.weight[b, i, s]),
                "heads": [float(x) for x in self.heads[b, i, s]],
                "residual": float(self.residual[b, i]) if s == 0 else 0.0,
                "rank": s, "from_token": self.tokens[j]}
            if self.factors is not None and self.factor_heads is not None:
                row["factors"] = [
                    {"head": int(hd), "weight": float(self.heads[b, i, s, hd]),
                     **{name: float(v) for name, v in zip(FACTORS, self.factors[b, i, s, m], strict=True)}}
                    for m, hd in enumerate(self.factor_heads[b, i, s])]
            rows.append(row)
        return rows

    def to_pandas(self):
        """One row per edge: ``layer, position, token, from_layer, from_position,
        from_token, rank, weight, residual`` and ``head_0 .. head_{H-1}`` (each head's
        part). ``layer`` is the node the edge goes into (``from_layer = layer - 1``)."""
        import pandas as pd  # heavy: pandas, imported on use

        b, i, s = np.nonzero(self.valid)
        layers = np.asarray(self.layers)[b]
        j = self.from_position[b, i, s]
        tokens = np.asarray(self.tokens, dtype=object)
        data: dict[str, Any] = {
            "layer": layers, "position": i, "token": tokens[i], "from_layer": layers - 1,
            "from_position": j, "from_token": tokens[j], "rank": s,
            "weight": self.weight[b, i, s],
            "residual": np.where(s == 0, self.residual[b, i], 0.0).astype(np.float32)}
        for h in range(self.n_heads):
            data[f"head_{h}"] = self.heads[b, i, s, h]
        return pd.DataFrame(data)

    def visible_edges(self, threshold: float = 0.0, top_k: int | None = None) -> int:
        """How many edges have ``|weight| >= threshold`` and rank ``<= top_k`` (the self
        edge is rank 0; None: all): what the viewer draws at these slider settings
        (``window.cwlensGraph.visibleEdges()``)."""
        w = np.nan_to_num(np.abs(self.weight), nan=-1.0)
        ok = self.valid & (w >= threshold)
        if top_k is not None:
            ok[:, :, top_k + 1:] = False
        return int(ok.sum())

    # -- routes -------------------------------------------------------------------------
    def routes(self, target: int = -1, threshold: float = 0.04, absolute: bool = False
               ) -> ContributionGraph:
        """The information-flow routes to ``target`` (Ferrando & Voita 2024): from node
        ``(top layer, target)`` down, the incoming edges of every node reached whose
        ``weight >= threshold`` (``absolute=True``: ``|weight|``), and so on to layer 0.
        Returns the subgraph (the same graph with :attr:`keep` set; its ``compare``
        graph gets its own routes)."""
        t = self._position(target)
        thr = float(threshold)
        keep = route_mask(self.from_position, self.weight, t, thr, bool(absolute))
        if self.keep is not None:
            keep &= self.keep
        other = None if self.compare is None else self.compare.routes(t, thr, absolute)
        return replace(self, keep=keep, compare=other,
                       route={"target": t, "threshold": thr, "absolute": bool(absolute)})

    # -- viewer -------------------------------------------------------------------------
    def to_html(self, title: str | None = None, fragment: bool = False) -> str:
        """The interactive viewer (:mod:`cwlens.graphs.viewer`): a whole page, or with
        ``fragment=True`` a ``<div>`` with its script (for a notebook or a report)."""
        return viewer.fragment(self, title) if fragment else viewer.page(self, title)

    def _repr_html_(self) -> str:
        return self.to_html(fragment=True)

    def show(self):
        """Display the viewer in a notebook (Jupyter, VS Code); outside one, write it to a
        temporary file and return its path."""
        try:
            from IPython import get_ipython  # optional: IPython (in a notebook only)

            shell = get_ipython()
        except ImportError:
            shell = None
        if shell is not None:
            from IPython.display import HTML, display

            display(HTML(self.to_html(fragment=True)))
            return None

        path = Path(tempfile.mkdtemp(prefix="cwlens-graph-")) / "graph.html"
        return self.save(path)

    def save(self, path: str | Path, title: str | None = None) -> Path:
        """Write the viewer as one self-contained page (no network needed) to ``path``
        (parent folders are made); returns the path."""
        path = Path(path)
        if path.is_dir():
            raise InvalidArgumentError(f"path={str(path)!r} is a folder; pass the path of the "
                                       f".html file to write, e.g. {str(path / 'graph.html')!r}.")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_html(title), encoding="utf-8")
        return path


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise InvalidArgumentError(f"{what} must be an integer; got {value!r}.")
    return int(value)
