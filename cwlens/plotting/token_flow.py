"""The token-flow graph as a plotly figure: tokens across, layers up.

Nodes ``(layer l, position j)`` are drawn with a size and colour from their importance
``N_l[j]`` for the target position (see :mod:`cwlens.circuits.flow_math`); edges of the
pruned graph join ``(l, from_pos)`` to ``(l + 1, to_pos)`` with a width from ``|weight|``
(blue: positive, red: negative). Edges are drawn as a few line traces (binned widths),
so a 30-layer graph stays light.
"""

import numpy as np

from cwlens.plotting.heatmaps import token_labels


def token_flow_figure(flow, target: int = -1, threshold: float = 0.02, title: str | None = None,
                      width_bins: int = 5, source: str = ""):
    """Draw a :class:`cwlens.circuits.TokenFlow` for one target position. ``source``
    (e.g. ``"smollm2-135m, ioi prompt 0 of 8"``) starts the default title: what the
    graph was made from."""
    import plotly.graph_objects as go  # heavy: plotly, imported on use

    n_pos = flow.layer_flows.shape[-1]
    t = target % n_pos
    labels = token_labels(flow.str_tokens)
    nodes = flow.node_importance(t).numpy()  # [layer + 1, pos]
    edges = flow.edges(t, threshold)
    fig = go.Figure()
    w_max = max((abs(e["weight"]) for e in edges), default=1.0) or 1.0
    bins = np.linspace(0, w_max, width_bins + 1)
    for sign, colour in ((1, "rgba(33,102,172,{a})"), (-1, "rgba(178,24,43,{a})")):
        for b in range(width_bins):
            xs, ys = [], []
            for e in edges:
                w = abs(e["weight"])
                if np.sign(e["weight"]) != sign or not (bins[b] <= w <= bins[b + 1]) or (b > 0 and w == bins[b]):
                    continue
                xs += [e["from_pos"], e["to_pos"], None]
                ys += [e["layer"], e["layer"] + 1, None]
            if xs:
                fig.add_trace(go.Scatter(
                    x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                    line=dict(width=0.5 + 6 * (b + 1) / width_bins,
                              color=colour.format(a=0.25 + 0.6 * (b + 1) / width_bins)),
                ))
    layer_idx, pos_idx = np.meshgrid(np.arange(nodes.shape[0]), np.arange(n_pos), indexing="ij")
    size = 4 + 26 * np.sqrt(np.abs(nodes) / max(np.abs(nodes).max(), 1e-12))
    hover = [f"layer {ly} · {labels[p]}<br>importance {nodes[ly, p]:+.3f}"
             for ly, p in zip(layer_idx.ravel(), pos_idx.ravel(), strict=True)]
    fig.add_trace(go.Scatter(
        x=pos_idx.ravel(), y=layer_idx.ravel(), mode="markers", showlegend=False,
        marker=dict(size=size.ravel(), color=nodes.ravel(), colorscale="RdBu", cmid=0,
                    colorbar=dict(title="importance"), line=dict(width=0)),
        text=hover, hovertemplate="%{text}<extra></extra>",
    ))
    fig.update_layout(
        title=title or f"{source + '<br>' if source else ''}Token flow into {labels[t]} "
        f"({flow.rule} rule, edges |w| ≥ {threshold})",
        xaxis=dict(tickmode="array", tickvals=list(range(n_pos)), ticktext=labels, tickangle=-60),
        yaxis=dict(title="layer (residual stream entering it; top = final)"),
        height=max(450, 22 * nodes.shape[0] + 200), width=max(700, 28 * n_pos + 250),
        plot_bgcolor="white",
    )
    return fig
