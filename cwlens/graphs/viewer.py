"""The contribution graph's HTML viewer: one self-contained page (or a fragment for a
notebook cell or a report tab), no network. The drawing is a small hand-written canvas
renderer, ``assets/graph_viewer.js`` (package data, no library); the graph travels as
little-endian binary arrays in base64 inside a JSON block.

What is embedded (:func:`payload`): per metric, every edge's source position (int16,
or int32 past 32,767 positions) and weight (float32, so the panel shows Python's numbers
to 1e-6), each node's residual share, and, as far as :data:`BYTE_BUDGET` allows, each
edge's largest heads (index + float32) and, for the contribution, their factor split. At
4,096 positions x 30 layers with two metrics the edges alone fill the budget and the
panel shows the edge without its heads (``graph.node(layer, position)`` has them).
"""

from __future__ import annotations

import base64
import html
import json
import uuid
from dataclasses import replace
from importlib import resources
from typing import Any

import numpy as np

#: a :class:`cwlens.graphs.result.ContributionGraph` (not imported: result imports this module)
ContributionGraph = Any

#: the raw bytes of all embedded arrays (base64 adds a third): the page stays under 25 MB
BYTE_BUDGET = 17 * 2**20
#: of which at most this much for what the panel shows beyond the edges (heads, factors,
#: head shares), so that a mid-sized page still opens fast (512 positions: within 1 s)
DETAIL_BUDGET = 6 * 2**20


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()).decode("ascii")


def _edges(g: ContributionGraph) -> tuple[dict[str, Any], int]:
    """One metric's edges (every one: they are what is drawn) and their bytes."""
    valid = g.valid
    frm = np.where(valid, g.from_position, -1).astype(np.int16 if g.n_positions <= 32767 else np.int32)
    weight = np.where(valid, g.weight, np.nan).astype(np.float32)
    residual, attention = g.residual.astype(np.float32), g.attention.astype(np.float32)
    out = {"name": g.metric, "top_k": g.top_k, "slots": int(g.from_position.shape[2]),
           "from": _b64(frm), "from_bytes": frm.dtype.itemsize, "weight": _b64(weight),
           "residual": _b64(residual), "attention": _b64(attention), "heads_per_edge": 0}
    return out, frm.nbytes + weight.nbytes + residual.nbytes + attention.nbytes


def _details(out: dict[str, Any], g: ContributionGraph, budget: int) -> int:
    """Add to ``out`` what fits in ``budget`` bytes, in this order: each head's share of
    the layer, each edge's largest heads (all where they fit), the factor split; returns
    the bytes used."""
    used = 0
    share = g.head_share.astype(np.float32)
    if share.nbytes <= budget:
        out["head_share"] = _b64(share)
        used += share.nbytes
    slots, h = g.weight.size, g.n_heads
    m = int(min(h, max(0, (budget - used) // (5 * slots))))  # heads per edge that fit
    if m == h or m and (budget - used) // (4 * slots) >= h:  # all heads: no index needed
        out["heads_per_edge"] = h
        out["head_value"] = _b64(g.heads.astype(np.float32))
        used += 4 * slots * h
    elif m:
        order = np.argsort(-np.abs(np.nan_to_num(g.heads)), axis=-1, kind="stable")[..., :m]
        out["heads_per_edge"] = m
        out["head_index"] = _b64(order.astype(np.uint8))
        out["head_value"] = _b64(np.take_along_axis(g.heads, order, -1).astype(np.float32))
        used += 5 * slots * m
    if g.factors is not None and g.factor_heads is not None:
        f, fh = g.factors.astype(np.float32), g.factor_heads.astype(np.uint8)
        if f.nbytes + fh.nbytes <= budget - used:
            out.update(factor_heads=_b64(fh), factors=_b64(f), factor_m=int(fh.shape[-1]))
            used += f.nbytes + fh.nbytes
    return used


def _slots_that_fit(graphs: list[ContributionGraph]) -> int:
    """How many edge slots per node (the self edge and the strongest others) fit in
    :data:`BYTE_BUDGET` for all ``graphs`` (all of them up to ~5,000 positions x 30 layers
    at top-k 8 with two metrics; at least 2)."""
    slots = int(graphs[0].from_position.shape[2])
    per_node = sum(one.residual.size * 8 for one in graphs)  # the shares: always there
    per_slot = sum(one.from_position[:, :, 0].size * (4 + (2 if one.n_positions <= 32767 else 4))
                   for one in graphs)
    return max(2, min(slots, (BYTE_BUDGET - per_node) // max(per_slot, 1)))


def _cut(g: ContributionGraph, slots: int) -> ContributionGraph:
    """``g`` with each node's first ``slots`` edges (the self edge, then the strongest)."""
    if slots >= g.from_position.shape[2]:
        return g
    part = {name: getattr(g, name)[:, :, :slots] for name in
            ("from_position", "weight", "heads", "factor_heads", "factors", "keep")
            if getattr(g, name) is not None}
    return replace(g, **part, top_k=slots - 1, compare=None)


def payload(g: ContributionGraph, title: str | None = None) -> dict[str, Any]:
    """What the viewer reads: the tokens, the layers and each metric's arrays (every edge
    kept where :data:`BYTE_BUDGET` allows, else each node's strongest ones; the per-head
    and factor splits as far as :data:`BYTE_BUDGET` and :data:`DETAIL_BUDGET` allow, the
    first metric first)."""
    graphs = [g] if g.compare is None else [g, g.compare]
    slots = _slots_that_fit(graphs)
    graphs = [_cut(one, slots) for one in graphs]
    metrics, sizes = zip(*(_edges(one) for one in graphs), strict=True)
    if slots < g.from_position.shape[2]:
        for m in metrics:
            m["graph_top_k"] = g.top_k  # the page holds fewer: the viewer says so
    left = max(0, min(BYTE_BUDGET - sum(sizes), DETAIL_BUDGET))
    for k, (out, one) in enumerate(zip(metrics, graphs, strict=True)):
        left -= _details(out, one, left // (len(graphs) - k))
    model = g.model_name.rstrip("/").rsplit("/", 1)[-1]  # a local folder: its name
    return {
        "title": title or f"Contribution graph ({g.metric})" + (f" · {model}" if model else ""),
        "tokens": list(g.tokens), "layers": list(g.layers), "n_heads": g.n_heads,
        "metrics": list(metrics), "route": g.route,
    }


def _asset(name: str) -> str:
    return resources.files("cwlens.graphs").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


def _json(data: dict[str, Any]) -> str:
    # inside <script type="application/json">: no "</" may close the element early
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")


def fragment(g: ContributionGraph, title: str | None = None) -> str:
    """A ``<div>`` holding the viewer, its style, data and script (no external resource):
    for a notebook cell or a tab of a report; several on one page are independent."""
    uid = "cwg-" + uuid.uuid4().hex[:10]
    return (f'<div class="cwlens-graph" id="{uid}" style="height:720px"></div>\n'
            f"<style>{_asset('graph_viewer.css')}</style>\n"
            f'<script type="application/json" id="{uid}-data">{_json(payload(g, title))}</script>\n'
            f"<script>{_asset('graph_viewer.js')}\n"
            # the cell's own elements, even where a notebook runs the script before it
            # attaches the output to the document
            "(function () { var s = document.currentScript, up = s && s.parentNode;\n"
            f'  function find(id) {{ return document.getElementById(id) || (up && up.querySelector("#" + id)); }}\n'
            f'  cwlensGraphViewer(find("{uid}"), JSON.parse(find("{uid}-data").textContent));\n'
            "})();</script>\n")


def page(g: ContributionGraph, title: str | None = None) -> str:
    """A whole HTML page: the viewer filling the window."""
    name = title or f"Contribution graph ({g.metric})"
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(name)}</title>"
            "<style>html,body{margin:0;height:100%;overflow:hidden}"
            ".cwlens-graph{height:100vh!important}</style></head>\n<body>\n"
            + fragment(g, title) + "</body></html>\n")
