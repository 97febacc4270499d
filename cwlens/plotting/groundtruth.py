"""Every method against compiled ground truth: ROC AUC heatmaps, methods x programs, one
panel per level (the summary of :func:`cwlens.groundtruth.scoring.summarize`, read as a
DataFrame: this module imports no cwlens.groundtruth)."""

import numpy as np

LEVELS = (("layer", "main", "per layer and head vs movement (b)"),
          ("layer", "with_fallback", "same, fall-back rows included"),
          ("input", "main", "per input token vs dependence (a)"),
          ("component", "main", "per head vs components (c)"))


def _matrix(summary, level: str, scope: str, labels: dict[str, str]):
    sub = summary[(summary["level"] == level) & (summary["scope"] == scope)]
    programs = list(dict.fromkeys(sub["program"]))
    rows = list(dict.fromkeys(sub["method"]))
    z = np.full((len(rows), len(programs)), np.nan)
    text: list[list[str]] = []
    hover: list[list[str]] = []
    for i, m in enumerate(rows):
        text.append([])
        hover.append([])
        for j, p in enumerate(programs):
            cell = sub[(sub["method"] == m) & (sub["program"] == p)]
            if cell.empty or not np.isfinite(cell["auroc"].iloc[0]):
                text[-1].append("n/a")
                hover[-1].append(f"{labels.get(m, m)} on {p}: no input with both a positive and a negative")
                continue
            r = cell.iloc[0]
            z[i, j] = r["auroc"]
            mark = (" ▲" if r["delta"] > 0 else " ▼") if bool(r["resolved"]) else ""
            text[-1].append(f"{r['auroc']:.2f}{mark}")
            hover[-1].append(
                f"{labels.get(m, m)} on {p}<br>AUROC {r['auroc']:.3f} [{r['auroc_low']:.3f}, "
                f"{r['auroc_high']:.3f}]<br>precision at |truth| {r['precision_at_truth']:.3f}"
                f"<br>{int(r['n'])} inputs" + (f"<br>vs {r['reference']}: {r['delta']:+.3f} "
                                               f"[{r['delta_low']:+.3f}, {r['delta_high']:+.3f}]"
                                               if np.isfinite(r["delta"]) else ""))
    return z, [labels.get(m, m) for m in rows], programs, text, hover


def auroc_figure(summary, labels: dict[str, str] | None = None, source: str = ""):
    """Four heatmaps (ROC AUC, 0.5 = chance): the layer methods against the movement (fall-back
    rows left out, then included), the token-level methods against the input dependence, the
    head scores against the components. ▲/▼: above/below the panel's first row, resolved
    (Holm). ``labels``: method -> label; ``source``: what it was made from (the title says)."""
    import plotly.graph_objects as go  # heavy: plotly, imported on use
    from plotly.subplots import make_subplots

    labels = labels or {}
    panels = [p for p in LEVELS if not summary[(summary["level"] == p[0]) & (summary["scope"] == p[1])].empty]
    sizes = [len(set(summary[(summary["level"] == lv) & (summary["scope"] == sc)]["method"]))
             for lv, sc, _ in panels]
    fig = make_subplots(rows=len(panels), cols=1, row_heights=sizes, vertical_spacing=0.06,
                        subplot_titles=[t for _, _, t in panels])
    for row, (level, scope, _) in enumerate(panels, start=1):
        z, methods, programs, text, hover = _matrix(summary, level, scope, labels)
        fig.add_trace(go.Heatmap(
            z=z, x=programs, y=methods, text=text, texttemplate="%{text}", customdata=hover,
            hovertemplate="%{customdata}<extra></extra>", colorscale="RdBu", zmid=0.5, zmin=0,
            zmax=1, showscale=row == 1, colorbar=dict(title="ROC AUC"),
        ), row=row, col=1)
        fig.update_yaxes(autorange="reversed", row=row, col=1)
    n_programs = len(set(summary["program"]))
    fig.update_layout(
        title=("Every method against compiled ground truth: mean per-input ROC AUC (0.5 = chance)"
               + (f"<br><sup>{source}</sup>" if source else "")),
        height=220 + 24 * sum(sizes) + 60 * len(panels), width=max(820, 260 + 110 * n_programs),
        margin=dict(l=200),
    )
    return fig
