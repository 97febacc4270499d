"""Faithfulness curves: ΔPPL or accuracy against removal rate, one line per metric,
comprehensiveness and sufficiency side by side, each with its own y scale (plotly,
imported lazily)."""

from cwlens.core import metrics as _metrics
from cwlens.errors import InvalidArgumentError

# one colour and legend label per metric (the registry: cwlens.core.metrics)
COLORS = {name: m.color for name, m in _metrics.REGISTRY.items()}
LABELS = {name: m.label for name, m in _metrics.REGISTRY.items()}
YLABEL = {"delta_ppl": "ΔPPL (masked − clean)", "acc": "accuracy", "acc_norm": "accuracy (length-norm.)",
          "gold_ll": "log-likelihood of gold", "ppl": "perplexity"}


def faithfulness_curves(summary, dataset: str, measure: str, title: str | None = None):
    """A figure with two panels (comprehensiveness | sufficiency) from
    :func:`cwlens.faithfulness.summarize` output; error bars are the bootstrap CI.
    The clean value is drawn as a dashed line (and rate 0 starts every curve there).
    The title (``title``, or one naming the dataset and the measure) ends with the
    number of samples, ``(n = 50 samples)``."""
    import plotly.graph_objects as go  # heavy: plotly, imported on use
    from plotly.subplots import make_subplots

    sub = summary[(summary.dataset == dataset) & (summary.measure == measure)]
    clean = sub[sub["mode"] == "clean"]
    modes = _metrics.MODES
    fig = make_subplots(rows=1, cols=2, shared_yaxes=False, horizontal_spacing=0.08, subplot_titles=(
        "<b>comprehensiveness</b>: remove top-ranked<br>(more damage = more faithful)",
        "<b>sufficiency</b>: remove bottom-ranked<br>(less damage = more faithful)"))
    metrics = [m for m in COLORS if m in set(sub.metric)]
    span = float(sub.rate.max()) if len(sub) else 1.0
    # a small horizontal offset per metric, so that equal curves (e.g. vw and vw-output-
    # normalised at row scope) and overlapping error bars stay visible
    offset = {m: (i - (len(metrics) - 1) / 2) * 0.008 * span for i, m in enumerate(metrics)}
    clean_value = float(clean["mean"].iloc[0]) if len(clean) else (0.0 if measure == "delta_ppl" else None)
    start = 0.0 if measure == "delta_ppl" else clean_value
    for col, mode in enumerate(modes, start=1):
        for metric in metrics:
            d = sub[(sub.metric == metric) & (sub["mode"] == mode)].sort_values("rate")
            if not len(d):
                continue
            x, y = [r + offset[metric] for r in d.rate], list(d["mean"])
            up, down = list(d.ci_high - d["mean"]), list(d["mean"] - d.ci_low)
            if start is not None and 0.0 not in set(d.rate):
                x, y, up, down = [0.0] + x, [start] + y, [0.0] + up, [0.0] + down
            fig.add_trace(go.Scatter(
                x=x, y=y, mode="lines+markers", name=LABELS[metric], legendgroup=metric,
                showlegend=col == 1, line=dict(color=COLORS[metric],
                                               dash="dot" if metric == "random" else "solid"),
                error_y=dict(type="data", array=up, arrayminus=down, thickness=1, width=3),
            ), row=1, col=col)
        if clean_value is not None and measure != "delta_ppl":
            extra = {"annotation_text": "clean"} if col == 1 else {}
            fig.add_hline(y=clean_value, line_dash="dash", line_color="black", row=1, col=col, **extra)
        fig.update_xaxes(title_text="removal rate (fraction of entries per unit)", row=1, col=col)
    for col in (1, 2):  # separate y scales: comprehensiveness damage can be 100x sufficiency's
        fig.update_yaxes(title_text=YLABEL.get(measure, measure), row=1, col=col)
    n = int(sub["n"].max()) if len(sub) else 0
    head = title or f"{dataset}: {YLABEL.get(measure, measure)} under value masking"
    fig.update_layout(
        title=f"{head} (n = {n} samples)",
        template="plotly_white", width=1150, height=520, legend=dict(orientation="h", y=-0.2),
        margin=dict(t=110),
    )
    return fig


def aopc_curves(curves, aopc_summary=None, title: str = "", ylabel: str = "damage"):
    """Perturbation curves, one equal step per rate (AOPC weighs every rate equally; on a
    log axis 0.8-0.99 would crowd together) (comprehensiveness | sufficiency): the mean
    damage per rate with its BCa bootstrap band, one line per metric; with
    ``aopc_summary`` (:func:`cwlens.faithfulness.aopc.aopc_summary`) the legend gives each
    metric's AOPC. ``curves``: :func:`cwlens.faithfulness.aopc.curve_summary` output."""
    import plotly.graph_objects as go  # heavy: plotly, imported on use
    from plotly.subplots import make_subplots

    modes = _metrics.MODES
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08, subplot_titles=(
        "<b>comprehensiveness</b>: remove top-ranked<br>(higher curve = more faithful)",
        "<b>sufficiency</b>: remove bottom-ranked<br>(lower curve = more faithful)"))
    metrics = [m for m in COLORS if m in set(curves.metric)]
    rates = sorted(set(curves.rate))
    step = {r: i for i, r in enumerate(rates)}
    for col, mode in enumerate(modes, start=1):
        for metric in metrics:
            d = curves[(curves.metric == metric) & (curves["mode"] == mode)].sort_values("rate")
            if not len(d):
                continue
            name = LABELS[metric]
            if aopc_summary is not None:
                hit = aopc_summary[(aopc_summary.metric == metric) & (aopc_summary["mode"] == mode)]
                if len(hit):
                    name += f" ({'comp' if col == 1 else 'suff'} AOPC {hit['aopc'].iloc[0]:.3g})"
            color = COLORS[metric]
            fig.add_trace(go.Scatter(  # the CI band: upper edge, then lower edge back
                x=[step[r] for r in d.rate] + [step[r] for r in d.rate][::-1],
                y=list(d.ci_high) + list(d.ci_low)[::-1],
                mode="lines", fill="toself", fillcolor=_rgba(color, 0.10), line=dict(width=0),
                hoverinfo="skip",
                showlegend=False, legendgroup=f"{metric}{col}"), row=1, col=col)
            fig.add_trace(go.Scatter(
                x=[step[r] for r in d.rate], y=list(d["mean"]), mode="lines+markers", name=name,
                legendgroup=f"{metric}{col}", legend="legend" if col == 1 else "legend2",
                line=dict(color=color, dash="dot" if metric == "random" else "solid")),
                row=1, col=col)
        fig.update_xaxes(title_text="removal rate (one step per rate)", tickvals=list(range(len(rates))),
                         ticktext=[f"{r:g}" for r in rates], row=1, col=col)
        fig.update_yaxes(title_text=ylabel, row=1, col=col)
    n = int(curves["n"].max()) if len(curves) else 0
    fig.update_layout(
        title=f"{title} (n = {n}; bands: 95% BCa bootstrap CI)", template="plotly_white",
        width=1250, height=600, margin=dict(t=110, b=200),
        legend=dict(orientation="v", x=0.0, y=-0.18, yanchor="top", font=dict(size=11)),
        legend2=dict(orientation="v", x=0.55, y=-0.18, yanchor="top", font=dict(size=11)),
    )
    return fig


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def per_layer_curves(damage, title: str = "", ylabel: str = "damage"):
    """Mean damage per masked layer, one line per metric (comprehensiveness |
    sufficiency), from the damage rows of a ``--per-layer`` run
    (:func:`cwlens.faithfulness.aopc.damages`: one ``layers`` label per layer)."""
    import plotly.graph_objects as go  # heavy: plotly, imported on use
    from plotly.subplots import make_subplots

    if not len(damage) or not damage["layers"].astype(str).str.fullmatch(r"\d+").all():
        raise InvalidArgumentError("per_layer_curves needs the rows of a per-layer run (one "
                                   "layer masked at a time: FaithfulnessConfig(per_layer=True)).")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08, subplot_titles=(
        "<b>comprehensiveness</b> (higher = more faithful)", "<b>sufficiency</b> (lower = more faithful)"))
    for col, mode in enumerate(_metrics.MODES, start=1):
        for metric in [m for m in COLORS if m in set(damage["metric"])]:
            g = damage[(damage["mode"] == mode) & (damage["metric"] == metric)]
            mean = g.groupby(g["layers"].astype(int))["damage"].mean()
            fig.add_trace(go.Scatter(x=list(mean.index), y=list(mean.values), mode="lines+markers",
                                     name=LABELS[metric], legendgroup=metric, showlegend=col == 1,
                                     line=dict(color=COLORS[metric],
                                               dash="dot" if metric == "random" else "solid")),
                          row=1, col=col)
        fig.update_xaxes(title_text="masked layer", row=1, col=col)
        fig.update_yaxes(title_text=ylabel, row=1, col=col)
    rates = ", ".join(f"{r:g}" for r in sorted(set(damage["rate"])))
    fig.update_layout(title=f"{title}, rate {rates} (n = {damage['sample_id'].nunique()} documents)",
                      template="plotly_white", width=1150, height=480,
                      legend=dict(orientation="h", y=-0.2))
    return fig
