"""Attention-sink figures, drawn from the tables of :mod:`cwlens.sinks` (plotly, lazy).

Every function takes pandas tables and returns a plotly figure; :func:`all_figures`
writes them all as ``sinks_*.html`` / ``.png``. Signed quantities (cosines, log norm
ratios, ΔPPL) use scales or reference lines centred at 0.
"""

from pathlib import Path

import numpy as np

from cwlens.plotting.export import save_figure

SINK, TAIL, CONTROL = "#d62728", "#1f77b4", "#7f7f7f"
FONT = dict(size=13)


def _layout(fig, title, width=1200, height=520):
    fig.update_layout(title=dict(text=title, x=0.01), width=width, height=height, font=FONT,
                      template="plotly_white", margin=dict(t=90, l=70, r=30, b=60))
    return fig


def sink_rate_vs_contribution(layers, heads, eps=0.3, model_label=""):
    """Left: per layer, the sink's attention vs its share of the layer output. Right: per
    head, sink rate vs the sink's intra-head contribution (y = x dashed)."""
    import plotly.graph_objects as go  # heavy: plotly, imported on use
    from plotly.subplots import make_subplots

    fig = make_subplots(cols=2, column_widths=[0.55, 0.45], horizontal_spacing=0.1, subplot_titles=(
        "per layer (mean over heads and texts)", "per head (mean over texts)"))
    fig.add_trace(go.Scatter(x=layers.layer, y=layers.sink_rate, name="sink attention (rate)",
                             mode="lines+markers", line=dict(color=SINK)), 1, 1)
    fig.add_trace(go.Scatter(x=layers.layer, y=layers.sink_token_contribution, mode="lines+markers",
                             name="sink contribution to the layer output (inter, summed over heads)",
                             line=dict(color=TAIL)), 1, 1)
    fig.add_hline(y=0, line=dict(color="black", width=1), row=1, col=1)
    fig.add_trace(go.Scatter(
        x=heads.sink_rate, y=heads.sink_contribution_intra, mode="markers", name="heads",
        marker=dict(color=heads.layer, colorscale="Viridis", size=7, showscale=True,
                    colorbar=dict(title="layer", x=1.0)),
        text=[f"L{r.layer}H{r.head}" for r in heads.itertuples()],
        hovertemplate="%{text}<br>sink rate %{x:.3f}<br>sink contribution %{y:.3f}<extra></extra>",
        showlegend=False), 1, 2)
    lim = float(max(1.0, heads.sink_contribution_intra.max()))
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="contribution = attention",
                             line=dict(color="black", dash="dash", width=1)), 1, 2)
    fig.add_vline(x=eps, line=dict(color=CONTROL, dash="dot"), row=1, col=2)
    fig.add_annotation(x=eps, y=lim, text=f"sink head ε={eps}", showarrow=False, xanchor="left",
                       row=1, col=2)
    fig.update_xaxes(title_text="layer", row=1, col=1)
    fig.update_yaxes(title_text="share of the row (attention / contribution)", row=1, col=1)
    fig.update_xaxes(title_text="sink rate (attention on the first token)", range=[0, 1], row=1, col=2)
    fig.update_yaxes(title_text="sink contribution (intra-head)", row=1, col=2)
    fig.update_layout(legend=dict(orientation="h", y=-0.18))
    return _layout(fig, f"{model_label}: the sink gets attention, not contribution", height=560)


def factor_split(layers, model_label=""):
    """Per layer: attention, relative norm, cosine and contribution of the sink token vs
    the mean tail token (intra-head, mean over heads and texts)."""
    import plotly.graph_objects as go  # heavy: plotly, imported on use
    from plotly.subplots import make_subplots

    names = {"attention": "attention α", "relative_norm": "relative norm ‖ṽ‖/‖o‖",
             "cosine": "cosine cos(o, ṽ)", "contribution": "contribution c = α·r·cos"}
    fig = make_subplots(rows=1, cols=4, subplot_titles=list(names.values()), horizontal_spacing=0.06)
    for col, key in enumerate(names, start=1):
        for who, color in (("sink", SINK), ("tail", TAIL)):
            fig.add_trace(go.Scatter(
                x=layers.layer, y=layers[f"split_{who}_{key}"], mode="lines+markers",
                marker=dict(size=5), line=dict(color=color),
                name="sink token" if who == "sink" else "mean tail token", showlegend=col == 1,
            ), 1, col)
        if key in ("cosine", "contribution"):
            fig.add_hline(y=0, line=dict(color="black", width=1), row=1, col=col)
        fig.update_xaxes(title_text="layer", row=1, col=col)
    fig.update_yaxes(type="log", row=1, col=2)
    fig.update_layout(legend=dict(orientation="h", y=-0.2))
    return _layout(fig, f"{model_label}: factor split of the contribution, sink vs mean tail token "
                   "(intra-head; mean over all heads and texts)", width=1500, height=460)


def cosine_distributions(hist, model_label=""):
    """Per layer, the distribution of three cosines with the sink's projected value
    (heatmaps of the fraction of values per bin; x is signed, 0 marked)."""
    import plotly.graph_objects as go  # heavy: plotly, imported on use
    from plotly.subplots import make_subplots

    titles = {"value": "cos(ṽ_sink, ṽ_j), tail tokens j",
              "tail_mix": "cos(ṽ_sink, tail mixture B_i)",
              "output": "cos(ṽ_sink, head output o_i)"}
    fig = make_subplots(cols=3, subplot_titles=list(titles.values()), horizontal_spacing=0.06)
    for col, (measure, _) in enumerate(titles.items(), start=1):
        h = hist[hist.measure == measure]
        grid = h.pivot_table(index="layer", columns="bin_left", values="count", aggfunc="sum")
        frac = grid.div(grid.sum(axis=1).replace(0, np.nan), axis=0)
        centres = (np.asarray(grid.columns) + 0.025).round(3)
        fig.add_trace(go.Heatmap(
            z=frac.values, x=centres, y=grid.index, colorscale="Viridis", zmin=0,
            zmax=float(np.nanquantile(frac.values, 0.99)), showscale=col == 3,
            colorbar=dict(title="fraction<br>of layer"),
            hovertemplate="layer %{y}<br>cosine %{x}<br>fraction %{z:.3f}<extra></extra>"), 1, col)
        mean = (frac * centres).sum(axis=1)
        fig.add_trace(go.Scatter(x=mean, y=grid.index, mode="lines", line=dict(color="orange", width=2),
                                 name="mean cosine per layer", showlegend=col == 1), 1, col)
        fig.add_vline(x=0, line=dict(color="red", width=1.5, dash="dash"), row=1, col=col)
        fig.update_xaxes(title_text="cosine", range=[-1, 1], row=1, col=col)
        fig.update_yaxes(title_text="layer" if col == 1 else None, row=1, col=col)
    fig.update_layout(legend=dict(orientation="h", y=-0.18))
    return _layout(fig, f"{model_label}: anti-alignment of the sink's value (left of the dashed "
                   "line = opposed)", width=1500, height=560)


def sweep_figure(curves, sweep, heads, n_heads=6, model_label=""):
    """Left: the layer output's mean norm vs a common sink rate s (log2 of the ratio to the
    clean norm, centred at 0), with each layer's median s* and actual rate. Right: the
    curves of the most sink-heavy heads with s* (x) and the actual rate (o)."""
    import plotly.graph_objects as go  # heavy: plotly, imported on use
    from plotly.subplots import make_subplots

    fig = make_subplots(cols=2, horizontal_spacing=0.12, subplot_titles=(
        "layer output, all heads set to s: log2(‖o(s)‖ / ‖o‖)",
        f"the {n_heads} most sink-heavy heads: mean ‖o(s)‖ / mean clean ‖o‖ (dotted: clean)"))
    lay = curves[curves["head"] == -1]
    grid = lay.pivot_table(index="layer", columns="s", values="norm_rel")
    z = np.log2(grid.values.clip(1e-6))
    zmax = float(np.nanquantile(np.abs(z), 0.98)) or 1.0
    fig.add_trace(go.Heatmap(z=z, x=np.asarray(grid.columns), y=grid.index, colorscale="RdBu_r",
                             zmid=0, zmin=-zmax, zmax=zmax,
                             colorbar=dict(title="log2 ratio", x=0.44),
                             hovertemplate="layer %{y}<br>s %{x:.2f}<br>log2 %{z:.2f}<extra></extra>"),
                  1, 1)
    ls = sweep[sweep["head"] == -1].groupby("layer", as_index=False)[["actual_rate", "s_star_median"]].median()
    fig.add_trace(go.Scatter(x=ls.actual_rate, y=ls.layer, mode="markers", name="actual rate (mean over heads)",
                             marker=dict(symbol="circle", color="black", size=8,
                                         line=dict(color="white", width=1.5))), 1, 1)
    fig.add_trace(go.Scatter(x=ls.s_star_median, y=ls.layer, mode="markers", name="s* (median over queries)",
                             marker=dict(symbol="x", color="gold", size=9, line=dict(width=1))), 1, 1)
    top = heads.sort_values("sink_rate", ascending=False).head(n_heads)
    palette = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d", "#666666"]
    per_head = sweep[sweep["head"] >= 0].groupby(["layer", "head"], as_index=False)[
        ["actual_rate", "s_star_median"]].median()
    for k, r in enumerate(top.itertuples()):
        c = curves[(curves.layer == r.layer) & (curves["head"] == r.head)].sort_values("s")
        col = palette[k % len(palette)]
        name = f"L{r.layer}H{r.head}"
        fig.add_trace(go.Scatter(x=c.s, y=c.norm_rel, mode="lines", name=name, line=dict(color=col)), 1, 2)
        p = per_head[(per_head.layer == r.layer) & (per_head["head"] == r.head)].iloc[0]
        for x, sym in ((p.actual_rate, "circle"), (p.s_star_median, "x")):
            y = float(np.interp(x, c.s, c.norm_rel))
            fig.add_trace(go.Scatter(x=[x], y=[y], mode="markers", showlegend=False,
                                     marker=dict(symbol=sym, size=10, color=col, line=dict(width=1))),
                          1, 2)
    fig.add_hline(y=1, line=dict(color="black", width=1, dash="dot"), row=1, col=2)
    fig.update_xaxes(title_text="sink rate s", range=[0, 1], row=1, col=1)
    fig.update_yaxes(title_text="layer", row=1, col=1)
    fig.update_xaxes(title_text="sink rate s (o = actual rate, x = s*)", range=[0, 1], row=1, col=2)
    fig.update_yaxes(title_text="mean ‖o(s)‖ / mean clean ‖o‖ (log)", type="log", row=1, col=2)
    fig.update_layout(legend=dict(orientation="h", y=-0.18))
    return _layout(fig, f"{model_label}: output norm vs sink rate (closed form ‖s·ṽ_sink + (1−s)·B‖)",
                   width=1500, height=620)


def intervention_figure(ppl_summary, norm, model_label=""):
    """Left: ΔPPL vs the scale of the sink's value (all layers) and the random control.
    Middle: per layer, the change of the cone cosine of low-norm head outputs (after -
    clean; > 0 = pulled into the tail's cone). Right: the change of their norm."""
    import plotly.graph_objects as go  # heavy: plotly, imported on use
    from plotly.subplots import make_subplots

    fig = make_subplots(cols=3, horizontal_spacing=0.08, subplot_titles=(
        "ΔPPL vs value scale (all layers at once)",
        "low-norm heads: Δ cone cosine (after − clean)",
        "low-norm heads: output norm after / clean"))
    for target, color, label in (("sink", SINK, "sink token"), ("random", CONTROL, "random non-sink token")):
        d = ppl_summary[ppl_summary.target == target]
        xs = np.append(d.scale.to_numpy(dtype=float), 1.0)
        ys = np.append(d.delta_ppl.to_numpy(dtype=float), 0.0)
        order = np.argsort(xs)
        fig.add_trace(go.Scatter(x=xs[order], y=ys[order], mode="lines+markers", name=label,
                                 legendgroup=target, line=dict(color=color)), 1, 1)
        for scale, dash in ((0.0, "solid"), (0.5, "dot")):
            z = norm[(norm.target == target) & (norm.scale == scale)].sort_values("layer")
            if not len(z):
                continue
            fig.add_trace(go.Scatter(
                x=z.layer, y=z.cone_after_low - z.cone_before_low, mode="lines+markers",
                marker=dict(size=5), line=dict(color=color, dash=dash), legendgroup=target,
                name=f"{label}, scale {scale:g}", showlegend=True), 1, 2)
            fig.add_trace(go.Scatter(
                x=z.layer, y=z.norm_after_low / z.norm_before_low, mode="lines+markers",
                marker=dict(size=5), line=dict(color=color, dash=dash), legendgroup=target,
                showlegend=False), 1, 3)
    fig.add_hline(y=0, line=dict(color="black", width=1), row=1, col=1)
    fig.add_hline(y=0, line=dict(color="black", width=1), row=1, col=2)
    fig.add_hline(y=1, line=dict(color="black", width=1), row=1, col=3)
    fig.update_xaxes(title_text="scale of the value vector (1 = clean)", row=1, col=1)
    fig.update_yaxes(title_text="ΔPPL (PPL − clean PPL)", row=1, col=1)
    fig.update_xaxes(title_text="layer", row=1, col=2)
    fig.update_yaxes(title_text="Δ cos(o_i^h, mean tail ṽ)", row=1, col=2)
    fig.update_xaxes(title_text="layer", row=1, col=3)
    fig.update_yaxes(title_text="norm ratio (log)", type="log", row=1, col=3)
    fig.update_layout(legend=dict(orientation="h", y=-0.2))
    return _layout(fig, f"{model_label}: scaling the sink's value vector vs a random token's<br>"
                   "<sup>control: one random token per text; low-norm = clean ‖o_i^h‖ in the bottom "
                   "25% of the text's heads and queries in that layer</sup>", width=1600, height=580)


def observed_figure(bins_by_layer, head_fits, model_label=""):
    """Left: the observed relative head-output norm ``||o^h|| / mean_h ||o^h||`` per
    sink-rate bin, one line per layer (heads pooled). Right: per head, the shape read from
    its binned means (:mod:`cwlens.sinks.observed_shape`: interior only with a resolved
    fall and a resolved rise)."""
    import plotly.graph_objects as go  # heavy: plotly, imported on use
    from plotly.subplots import make_subplots

    fig = make_subplots(cols=2, column_widths=[0.62, 0.38], horizontal_spacing=0.12, subplot_titles=(
        "observed: mean relative ||o^h|| by the head's own sink rate",
        "per head: shape of the binned means"))
    layers = sorted(bins_by_layer.layer.unique())
    for i, ly in enumerate(layers):
        d = bins_by_layer[(bins_by_layer.layer == ly) & (bins_by_layer.n >= 20)]
        shade = i / max(1, len(layers) - 1)
        fig.add_trace(go.Scatter(
            x=d.rate, y=d.norm_rel, mode="lines+markers", name=f"layer {ly}",
            line=dict(color=f"rgba({int(40 + 200 * shade)}, {int(90 + 60 * (1 - shade))}, "
                            f"{int(220 - 180 * shade)}, 0.8)"),
            hovertemplate=f"L{ly}<br>rate %{{x:.2f}}<br>norm/mean %{{y:.2f}}<extra></extra>",
            showlegend=False), 1, 1)
    fig.add_hline(y=1, line=dict(color="black", width=1, dash="dot"), row=1, col=1)
    fitted = head_fits[head_fits["shape"] != "undetermined"]
    counts = fitted.groupby(["layer", "shape"]).size().unstack(fill_value=0)
    for where, color in (("interior", SINK), ("falling", TAIL), ("rising", CONTROL),
                         ("flat", "lightgray")):
        if where in counts:
            fig.add_trace(go.Bar(x=counts.index, y=counts[where], name=where,
                                 marker_color=color), 1, 2)
    fig.update_layout(barmode="stack", legend=dict(orientation="h", y=-0.18))
    fig.update_xaxes(title_text="sink rate a_i0 (bin mean)", range=[0, 1], row=1, col=1)
    fig.update_yaxes(title_text="||o_i^h|| / head mean", row=1, col=1)
    fig.update_xaxes(title_text="layer", row=1, col=2)
    fig.update_yaxes(title_text="heads", row=1, col=2)
    return _layout(fig, f"{model_label}: observed head-output norm vs sink rate (across queries)",
                   height=540)


def all_figures(tables, out_dir="figures", model_label="", png=True) -> list[Path]:
    """Write every sink figure that the tables allow; returns the paths."""
    out = Path(out_dir)
    written = []
    figs = {
        "sinks_rate_vs_contribution": lambda: sink_rate_vs_contribution(
            tables["layers"], tables["heads"], model_label=model_label),
        "sinks_factor_split": lambda: factor_split(tables["layers"], model_label),
        "sinks_cosines": lambda: cosine_distributions(tables["histograms"], model_label),
        "sinks_sweep": lambda: sweep_figure(tables["curves"], tables["sweep"], tables["heads"],
                                            model_label=model_label),
    }
    if "observed" in tables and "observed_heads" in tables:
        # here, not at the top: cwlens.sinks.observed imports pandas
        from cwlens.sinks.observed import bin_summary

        figs["sinks_observed"] = lambda: observed_figure(
            bin_summary(tables["observed"]), tables["observed_heads"], model_label)
    if "ppl_summary" in tables and "norm" in tables:
        figs["sinks_intervention"] = lambda: intervention_figure(
            tables["ppl_summary"], tables["norm"], model_label)
    for stem, make in figs.items():
        written += save_figure(make(), out / stem, png=png)
    return written
