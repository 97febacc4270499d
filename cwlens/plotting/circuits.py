"""Head scores against activation patching: one scatter per score (hover: the head)."""


def agreement_figure(comparison, title: str | None = None, model_label: str = ""):
    """Patching effect (y) against each score (x) of a :class:`cwlens.circuits.Comparison`.
    The default title says what it was made from: ``model_label`` (the model), the task
    and its number of prompts, and the number of heads."""
    import plotly.graph_objects as go  # heavy: plotly, imported on use
    from plotly.subplots import make_subplots

    names = [n for n in comparison.scores if n != "patching"]
    by_name = {a.score: a for a in comparison.agreements}
    patch = comparison.patching
    fig = make_subplots(
        rows=1, cols=len(names), shared_yaxes=True, horizontal_spacing=0.03,
        subplot_titles=[f"{n}<br>Spearman {by_name[n].spearman:+.2f}, top-{by_name[n].k} "
                        f"{by_name[n].top_k_overlap:.2f}" for n in names],
    )
    labels = patch.labels
    y = patch.flat().numpy()
    for col, name in enumerate(names, start=1):
        x = comparison.scores[name].flat().numpy()
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="markers", text=labels, showlegend=False, marker=dict(size=6, opacity=0.7),
            hovertemplate="%{text}<br>score %{x:.4f}<br>patching %{y:.4f}<extra></extra>",
        ), row=1, col=col)
        fig.update_xaxes(title_text="score", row=1, col=col)
    fig.update_yaxes(title_text="patching effect (metric drop)", row=1, col=1)
    task = comparison.task
    source = f"{model_label}, " if model_label else ""
    fig.update_layout(
        title=title or f"{source}{task.name} ({task.clean.shape[0]} prompts): head scores vs "
        f"activation patching ({len(labels)} heads)",
        height=440, width=300 * len(names) + 100, margin=dict(t=120),
    )
    return fig
