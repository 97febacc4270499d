"""The long-context sink figure: what the first token(s) receive as a function of query
position, attention vs contribution, per layer group (plotly, imported lazily).

Drawn from :func:`cwlens.sinks.by_position.position_curves`: one row of panels per key
set, one column per layer group; per metric a line (the bin means) and a band (the
quantile interval over the bin's queries). Query positions on a log axis.
"""

from cwlens.core import metrics as _metrics
from cwlens.errors import InvalidArgumentError

COLORS = {name: m.color for name, m in _metrics.REGISTRY.items()}
LABELS = {name: m.label for name, m in _metrics.REGISTRY.items()}
KEY_SET_TITLES = {"0": "first token", "0 1 2 3": "first 4 tokens (StreamingLLM's sinks)"}


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def sink_share_by_position(curves, model_label: str = "", n_tokens: int | None = None,
                           interval: str = "10-90% of queries"):
    """A grid of panels (key sets x layer groups) from a ``position_curves`` table.

    Args:
        curves: a pandas DataFrame with ``key_set, keys, metric, group, layers, position,
            mean, low, high`` (:func:`cwlens.sinks.by_position.position_curves`).
        model_label: shown in the title; ``n_tokens``: the text's length, shown too.
        interval: what ``low``-``high`` is, for the legend.
    """
    import plotly.graph_objects as go  # heavy: plotly, imported on use
    from plotly.subplots import make_subplots

    missing = {"key_set", "keys", "metric", "group", "layers", "position", "mean", "low", "high"} - set(curves)
    if missing:
        raise InvalidArgumentError(
            f"The curves table lacks columns {sorted(missing)}: pass the table of "
            "cwlens.sinks.by_position.position_curves.")
    sets = list(dict.fromkeys(curves.key_set))
    groups = list(dict.fromkeys(curves.group))
    metrics = list(dict.fromkeys(curves.metric))
    titles = []
    for s in sets:
        keys = curves[curves.key_set == s]["keys"].iloc[0]
        for g in groups:
            layers = curves[curves.group == g]["layers"].iloc[0]
            titles.append(f"{KEY_SET_TITLES.get(keys, 'keys ' + keys)} · {g} layers ({layers})")
    fig = make_subplots(rows=len(sets), cols=len(groups), subplot_titles=titles,
                        shared_xaxes=True, horizontal_spacing=0.05, vertical_spacing=0.1)
    for r, s in enumerate(sets, start=1):
        for c, g in enumerate(groups, start=1):
            for metric in metrics:
                d = curves[(curves.key_set == s) & (curves.group == g) & (curves.metric == metric)]
                d = d.sort_values("position")
                color = COLORS.get(metric, "#444444")
                label = LABELS.get(metric, metric)
                x = list(d.position)
                fig.add_trace(go.Scatter(
                    x=x + x[::-1], y=list(d.high) + list(d.low)[::-1], fill="toself",
                    fillcolor=_rgba(color, 0.18), line=dict(width=0), hoverinfo="skip",
                    legendgroup=metric, name=f"{label}: {interval}",
                    showlegend=r == 1 and c == 1), r, c)
                fig.add_trace(go.Scatter(
                    x=x, y=list(d["mean"]), mode="lines+markers", marker=dict(size=4),
                    line=dict(color=color), legendgroup=metric, name=f"{label}: mean",
                    showlegend=r == 1 and c == 1,
                    hovertemplate="position %{x:.0f}<br>%{y:.3f}<extra>" + label + "</extra>"), r, c)
            fig.add_hline(y=0, line=dict(color="black", width=1), row=r, col=c)
            fig.update_xaxes(type="log", row=r, col=c)
            if r == len(sets):
                fig.update_xaxes(title_text="query position i + 1 (keys it sees)", row=r, col=c)
        fig.update_yaxes(title_text="share of the query's row", row=r, col=1)
    length = f", one text of {n_tokens} tokens" if n_tokens else ""
    fig.update_layout(
        title=dict(text=f"{model_label}: what the first tokens receive as the context grows{length}"
                        "<br><sup>token level: attention averaged over heads, inter-head contribution "
                        "summed over heads; each query's value averaged over the group's layers</sup>",
                   x=0.01),
        template="plotly_white", width=1500, height=330 * len(sets) + 170,
        font=dict(size=13), legend=dict(orientation="h", y=-0.12), margin=dict(t=100, l=70, r=30, b=60))
    return fig
