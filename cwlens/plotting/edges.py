"""The per-edge truth's figure: the share of the top-k true |effect| each method's top k
edges capture, k = 1..20, one panel per run (the summaries of
:func:`cwlens.groundtruth.edge_study.summarise`, as dicts: this module imports no
cwlens.groundtruth)."""

COLORS = {"attention": "#1f77b4", "value_weighted": "#2ca02c", "value_weighted_output_normalized": "#9467bd",
          "contribution": "#d62728", "contribution_intra": "#ff7f0e", "alti": "#8c564b",
          "attention_gradient": "#17becf", "direct_logit_attribution": "#7f7f7f"}


def captured_figure(summaries: list[dict], labels: dict[str, str], title: str = ""):
    """One panel per summary: captured[k] (mean over inputs of the mean over layers) per
    method; the panel's title names the model, data, objective and inputs."""
    from plotly.subplots import make_subplots  # heavy: plotly, imported on use

    titles = [f"{s['model']}, {s['data']}, {s['objective']} ({s['n_inputs']} inputs)" for s in summaries]
    fig = make_subplots(rows=1, cols=len(summaries), subplot_titles=titles, shared_yaxes=True)
    for col, s in enumerate(summaries, start=1):
        for m, e in s["methods"].items():
            curve = e["curve"]
            fig.add_scatter(x=list(range(1, len(curve) + 1)), y=curve, mode="lines+markers",
                            name=labels.get(m, m), legendgroup=m, showlegend=col == 1,
                            line={"color": COLORS.get(m, "#444"), "width": 3 if m == "contribution" else 1.5},
                            marker={"size": 4}, row=1, col=col,
                            hovertemplate=f"{labels.get(m, m)}<br>k = %{{x}}<br>captured %{{y:.3f}}<extra></extra>")
        fig.update_xaxes(title_text="k (edges of a layer)", row=1, col=col)
    fig.update_yaxes(title_text="share of the top-k true |effect| captured", range=[0, 1.02], row=1, col=1)
    fig.update_layout(title=title or "Each method's top-k edges vs the k edges of largest true effect",
                      template="plotly_white", width=max(700, 520 * len(summaries)), height=480,
                      legend={"orientation": "h", "y": -0.2}, margin={"t": 80, "b": 120})
    return fig
