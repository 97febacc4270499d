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
from importlib import resources
from typing import Any

import numpy as np

#: a :class:`cwlens.graphs.result.ContributionGraph` (not imported: result imports this module)
ContributionGraph = Any

#: the raw bytes of the embedded arrays (base64 adds a third): the page stays under 25 MB
BYTE_BUDGET = 18 * 2**20


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()).decode("ascii")


def _metric(g: ContributionGraph, budget: int) -> tuple[dict[str, Any], int]:
    """One metric's arrays (and the bytes left of ``budget``)."""
    n = g.n_positions
    valid = g.valid
    frm = np.where(valid, g.from_position, -1)
    frm = frm.astype(np.int16 if n <= 32767 else np.int32)
    weight = np.where(valid, g.weight, np.nan).astype(np.float32)
    out: dict[str, Any] = {
        "name": g.metric, "top_k": g.top_k, "slots": int(g.from_position.shape[2]),
        "from": _b64(frm), "from_bytes": frm.dtype.itemsize, "weight": _b64(weight),
        "residual": _b64(g.residual.astype(np.float32)),
        "attention": _b64(g.attention.astype(np.float32))}
    budget -= frm.nbytes + weight.nbytes + 8 * g.residual.size
    slots, h = frm.size, g.n_heads
    share = g.head_share.astype(np.float32)
    if share.nbytes <= budget:
        out["head_share"] = _b64(share)
        budget -= share.nbytes
    m = int(min(h, max(0, budget // (5 * slots))))  # heads per edge that fit
    out["heads_per_edge"] = m
    if m:
        order = np.argsort(-np.abs(np.nan_to_num(g.heads)), axis=-1, kind="stable")[..., :m]
        if m == h:
            order = np.sort(order, axis=-1)
        vals = np.take_along_axis(g.heads, order, -1).astype(np.float32)
        out["head_index"] = _b64(order.astype(np.uint8))
        out["head_value"] = _b64(vals)
        budget -= slots * m * 5
    if g.factors is not None and g.factor_heads is not None:
        f = g.factors.astype(np.float32)
        fh = g.factor_heads.astype(np.uint8)
        if f.nbytes + fh.nbytes <= budget:
            out["factor_heads"] = _b64(fh)
            out["factors"] = _b64(f)
            out["factor_m"] = int(fh.shape[-1])
            budget -= f.nbytes + fh.nbytes
    return out, budget


def payload(g: ContributionGraph, title: str | None = None) -> dict[str, Any]:
    """What the viewer reads: the tokens, the layers and each metric's arrays."""
    graphs = [g] if g.compare is None else [g, g.compare]
    budget = BYTE_BUDGET
    metrics = []
    for one in graphs:
        m, budget = _metric(one, budget)
        metrics.append(m)
    return {
        "title": title or f"Contribution graph ({g.metric})" + (f" · {g.model_name}" if g.model_name else ""),
        "tokens": list(g.tokens), "layers": list(g.layers), "n_heads": g.n_heads,
        "metrics": metrics,
        "route": g.route,
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
            f'cwlensGraphViewer(document.getElementById("{uid}"), '
            f'JSON.parse(document.getElementById("{uid}-data").textContent));</script>\n')


def page(g: ContributionGraph, title: str | None = None) -> str:
    """A whole HTML page: the viewer filling the window."""
    name = title or f"Contribution graph ({g.metric})"
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(name)}</title>"
            "<style>html,body{margin:0;height:100%;overflow:hidden}"
            ".cwlens-graph{height:100vh!important}</style></head>\n<body>\n"
            + fragment(g, title) + "</body></html>\n")
