"""Faithfulness curves: ΔPPL or accuracy against removal rate, one line per metric,
comprehensiveness and sufficiency side by side, each with its own y scale (plotly,
imported lazily)."""

from cwlens import metrics as _metrics

# one colour and legend label per metric (the registry: cwlens.metrics)
COLORS = {name: m.color for name, m in _metrics.REGISTRY.items()}
LABELS = {name: m.label for name, m in _metrics.REGISTRY.items()}
YLABEL = {"delta_ppl": "ΔPPL (masked − clean)", "acc": "accuracy", "acc_norm": "accuracy (length-norm.)",
          "gold_ll": "log-likelihood of gold", "ppl": "perplexity"}


def faithfulness_curves(summary, dataset: str, measure: str, title: str | None = None):
    """A figure with two panels (comprehensiveness | sufficiency) from
    :func:`cwlens.faithfulness.summarize` output; error bars are the bootstrap CI.
    The clean value is drawn as a dashed line (and rate 0 starts every curve there)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    sub = summary[(summary.dataset == dataset) & (summary.measure == measure)]
    clean = sub[sub["mode"] == "clean"]
    modes = ("comprehensiveness", "sufficiency")
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
    fig.update_layout(
        title=title or f"{dataset}: {YLABEL.get(measure, measure)} under value masking (n = {n})",
        template="plotly_white", width=1150, height=520, legend=dict(orientation="h", y=-0.2),
        margin=dict(t=110),
    )
    return fig
