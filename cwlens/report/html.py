"""Render a :class:`~cwlens.report.analysis.TextAnalysis` as one self-contained HTML page.

plotly.js is inlined once (no CDN: the page works offline); every figure after the first
reuses it. Heatmaps of signed weights use a diverging scale centred at 0, scaled to each
slider step's own range (the range in the step's name and colour bar; a button switches
to one range for all steps), and show the factor split on hover. Masked cells (a decoder's
keys after the query) are grey, apart from the colour of a 0.
"""

import html
from pathlib import Path

import numpy as np

from cwlens.plotting.heatmaps import (
    MASKED_COLOUR,
    MASKED_NOTE,
    causal_mask,
    token_labels,
    with_masked,
)
from cwlens.report.analysis import TextAnalysis, _spread
from cwlens.report.printed import entry_list, plain, signed, token_at

# the per-head view's title, naming its kind: the two rows of a head sum to different things
HEAD_TITLES = {
    "intra": "Per head: attention vs contribution to the head's own output (intra-head: each "
             "row sums to 1, like attention)",
    "inter": "Per head: attention vs contribution to the layer output (inter-head: a head's row "
             "sums to its share of the layer output, not 1)",
}
HOVER = (
    "query %{y}<br>key %{x}<br>attention %{customdata[0]:.3f}<br>"
    "relative norm %{customdata[1]:.3f}<br>cosine %{customdata[2]:+.3f}<br>"
    "contribution %{z:+.3f}<extra></extra>"
)


def _slider_figure(pairs, labels, title, step_names, contribution_name, masked=None):
    """Attention | contribution heatmap pairs, one slider step per pair.

    Each step's contribution colour scale spans its own ``±max|c|`` (shown in the step's
    name and its colour bar); the buttons switch every step to one shared range and back.
    ``masked``: ``[query, key]`` bool, drawn grey (NaN) in both heatmaps."""
    import plotly.graph_objects as go  # heavy: plotly, imported on use
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("attention", contribution_name),
                        horizontal_spacing=0.14)
    ranges = [float(np.nanmax(np.abs(with_masked(c, masked)), initial=0.0)) or 1.0 for _, c, _ in pairs]
    shared = max(ranges)
    for i, (att, con, custom) in enumerate(pairs):
        visible = i == 0
        fig.add_trace(go.Heatmap(z=with_masked(att, masked), x=labels, y=labels, colorscale="Viridis",
                                 zmin=0, zmax=1, visible=visible, colorbar=dict(x=0.43, title="α"),
                                 hovertemplate="query %{y}<br>key %{x}<br>attention %{z:.3f}<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Heatmap(z=with_masked(con, masked), x=labels, y=labels, colorscale="RdBu_r",
                                 zmid=0, zmin=-ranges[i], zmax=ranges[i], visible=visible, customdata=custom,
                                 hovertemplate=HOVER, colorbar=dict(title=f"c, ±{ranges[i]:.2g}")),
                      row=1, col=2)
    steps = []
    for i, name in enumerate(step_names):
        vis = [False] * (2 * len(pairs))
        vis[2 * i] = vis[2 * i + 1] = True
        steps.append(dict(method="update", label=f"{name} (±{ranges[i]:.2g})", args=[{"visible": vis}]))
    con_traces = list(range(1, 2 * len(pairs), 2))

    def scale(rs):
        return dict(zmin=[-r for r in rs], zmax=list(rs), **{"colorbar.title.text": [f"c, ±{r:.2g}" for r in rs]})

    buttons = [dict(method="restyle", label="colour scale: each step's own range",
                    args=[scale(ranges), con_traces]),
               dict(method="restyle", label=f"colour scale: one range for all (±{shared:.2g})",
                    args=[scale([shared] * len(pairs)), con_traces])]
    side = max(420, 11 * len(labels))
    if masked is not None and np.asarray(masked).any():
        title = f"{title}<br><sup>{MASKED_NOTE}</sup>"
    fig.update_layout(title=dict(text=title, y=0.97, yanchor="top"),
                      sliders=[dict(active=0, steps=steps, pad=dict(t=60))],
                      updatemenus=[dict(type="buttons", direction="right", buttons=buttons, x=1.0,
                                        xanchor="right", y=1.05, yanchor="bottom", showactive=True)],
                      width=2 * side + 200, height=side + 260, plot_bgcolor=MASKED_COLOUR,
                      margin=dict(t=150))
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=8), showgrid=False, zeroline=False)
    fig.update_xaxes(tickfont=dict(size=8), tickangle=-60, showgrid=False, zeroline=False)
    return fig


def _sink_figure(a: TextAnalysis):
    import plotly.graph_objects as go  # heavy: plotly, imported on use

    layers = list(range(a.n_layers))
    att_sink = a.sink_attention.numpy()
    con_sink = a.sink_token_contribution.numpy()
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=layers, y=att_sink, mode="lines+markers", name="attention on first token (mean over heads, queries)"))
    fig.add_trace(go.Scatter(x=layers, y=con_sink, mode="lines+markers", name="contribution of first token to the layer output"))
    fig.add_hline(y=0, line_color="gray", line_width=1)
    fig.update_layout(title="First token: attention received vs contribution, per layer",
                      xaxis_title="layer", yaxis_title="share", height=420, width=1000,
                      legend=dict(orientation="h", y=-0.25))
    return fig


def _text_block(a: TextAnalysis, fold_at: int = 1500) -> str:
    """The analysed text; a long one is folded (click to show) so the figures come first."""
    body = f'<p class="mono">{html.escape(a.text)}</p>'
    if len(a.text) <= fold_at:
        return body
    return (f"<details><summary>{len(a.text):,} characters, {len(a.str_tokens):,} tokens "
            f"(click to show)</summary>{body}</details>")


def _table(headers, rows) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


BYTES_PER_NUMBER = 12  # plotly's JSON: ~12 characters per float32 in these figures


FIXED_BYTES = 500_000  # tables and page, beside plotly.js and the heatmaps


def _plotly_js_bytes() -> int:
    from plotly.offline import get_plotlyjs  # heavy: plotly, imported on use

    return len(get_plotlyjs().encode("utf-8"))


def fixed_bytes() -> int:
    """The report's size before any heatmap: inlined plotly.js and the tables."""
    return _plotly_js_bytes() + FIXED_BYTES


def estimated_bytes(n_layers: int, n_heads: int, n_head_layers: int, window: int) -> int:
    """About how large the report is: inlined plotly.js plus its heatmaps (5 numbers per
    drawn cell) plus the tables."""
    per_cell = (n_layers + n_head_layers * n_heads) * 5 * BYTES_PER_NUMBER
    return _plotly_js_bytes() + FIXED_BYTES + per_cell * window**2


def window_for(max_mb: float, n_layers: int, n_heads: int, n_head_layers: int) -> int:
    """The largest window whose report fits in ``max_mb`` megabytes (at least 1 token)."""
    per_cell = (n_layers + n_head_layers * n_heads) * 5 * BYTES_PER_NUMBER
    room = max_mb * 1e6 - _plotly_js_bytes() - FIXED_BYTES
    return max(1, int((max(room, 0) / per_cell) ** 0.5))


#: the report's two tabs: the report itself and the contribution graph (a page whose address
#: ends in #contribution-graph opens on the graph)
_TABS = """<style>.tabs{display:flex;gap:4px;margin:8px 0 16px;border-bottom:1px solid #ccc}
.tabs button{font:inherit;padding:6px 14px;border:1px solid #ccc;border-bottom:none;background:#f4f4f4;cursor:pointer}
.tabs button.on{background:#fff;font-weight:600;margin-bottom:-1px}</style>
<div class="tabs"><button class="on" data-tab="tab-report">Report</button>
<button data-tab="contribution-graph">Contribution graph (interactive)</button></div>
<script>(function () {
  function show(id) {
    document.querySelectorAll(".tabs button").forEach(function (b) {
      var on = b.dataset.tab === id; b.classList.toggle("on", on);
      document.getElementById(b.dataset.tab).hidden = !on;
    });
  }
  document.addEventListener("click", function (e) {
    var b = e.target.closest && e.target.closest(".tabs button"); if (b) show(b.dataset.tab);
  });
  window.cwlensReportTab = show;
  document.addEventListener("DOMContentLoaded", function () {
    if (location.hash === "#contribution-graph") show("contribution-graph");
  });
})();</script>
"""


def _graph_section(a: TextAnalysis) -> str:
    """The text's contribution graph (:mod:`cwlens.graphs.viewer`) as the report's second
    tab, or nothing."""
    if a.graph is None:
        return ""
    return ('<div id="contribution-graph" hidden>\n<h2>Contribution graph</h2>\n<p class="legend">Nodes: each '
            "position's residual stream after each layer (bottom: the embeddings); edges: the "
            "layer's token-level weight of each key times attention's share of the stream, the "
            "residual's own share on the self edge; contribution and attention side by side on "
            "one layout (the metric menu); click a node for its incoming edges, their heads and "
            "factor split (docs/graph.md).</p>\n" + a.graph.to_html(fragment=True) + "</div>")


def render_report(a: TextAnalysis, path: str | Path, layers: list[int] | None = None) -> Path:
    """Write the report to ``path`` and return it. ``layers``: per-head heatmaps for these.

    The heatmaps cover the analysis' window of tokens (see
    :func:`~cwlens.report.analysis.analyze_text`); every table covers all tokens except the
    per-query top tokens, listed for the window's queries."""
    labels = token_labels(a.window_tokens, a.window[0])
    w = a.window[1] - a.window[0]
    masked = causal_mask(w) if a.causal else None  # window queries and keys: the same positions
    layers = layers if layers is not None else _spread(a.n_layers, 4)
    view = a.head_view()  # the per-head heatmaps' kind (intra by default: rows sum to 1)
    custom = lambda idx: np.stack(  # noqa: E731
        [view["attention"][idx].numpy(), view["relative_norm"][idx].numpy(), view["cosine"][idx].numpy()], -1
    )
    tok = a.token_contribution()
    token_pairs = [
        (a.attention[ly].mean(0).numpy(), tok[ly].numpy(),
         np.stack([a.attention[ly].mean(0).numpy(), np.full(tok[ly].shape, np.nan), np.full(tok[ly].shape, np.nan)], -1))
        for ly in range(a.n_layers)
    ]
    head_pairs, head_names = [], []
    for ly in layers:
        for h in range(a.n_heads):
            head_pairs.append((a.attention[ly, h].numpy(), view["contribution"][ly, h].numpy(), custom((ly, h))))
            head_names.append(f"L{ly}H{h}")
    figs = [
        _sink_figure(a),
        _slider_figure(token_pairs, labels, "Token level: mean attention over heads vs contribution to the layer output",
                       [f"layer {ly}" for ly in range(a.n_layers)], "contribution (heads summed)", masked),
        _slider_figure(head_pairs, labels, HEAD_TITLES[a.head_kind], head_names,
                       f"contribution ({a.head_kind}-head)", masked),
    ]
    fig_html = [f.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, f in enumerate(figs)]

    q = len(a.str_tokens) - 1
    sink_rows = []
    for ly in range(a.n_layers):
        sink_rows.append([ly, f"{float(a.sink_rate[ly].mean()):.2f}", int((a.sink_rate[ly] > 0.3).sum()),
                          f"{float(a.sink_token_contribution[ly]):+.3f}", f"{a.closure_error[ly]:.1e}"])
    top_rows = []
    for query in range(*a.window):
        cells = [html.escape(token_at(query, a.str_tokens))]
        for ly in layers:
            tops = [(j, c) for j, _, c in a.top_tokens(ly, query, 3)]
            cells.append(html.escape(entry_list(tops, a.str_tokens, 2)))
        top_rows.append(cells)
    split_rows = []
    last = a.last_query
    for ly in layers:
        c = last["contribution"][ly]  # [head, key]
        for flat in c.abs().flatten().argsort(descending=True)[:5].tolist():
            h, j = divmod(flat, c.shape[1])
            split_rows.append([ly, h, html.escape(token_at(j, a.str_tokens)), plain(last["attention"][ly, h, j]),
                               plain(last["relative_norm"][ly, h, j]), signed(last["cosine"][ly, h, j]),
                               signed(c[h, j])])
    summary = "<br>".join(html.escape(line) for line in a.summary_lines())
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>cwlens report: {html.escape(a.model_name)}</title>
<style>body{{font-family:sans-serif;margin:24px;max-width:2200px}} table{{border-collapse:collapse;font-size:12px;margin:8px 0 24px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left}} th{{background:#f0f0f0}} .mono{{font-family:monospace;white-space:pre-wrap}}
.legend{{font-size:12px;color:#444;margin:4px 0}}</style>
</head><body>
<h1>cwlens report — {html.escape(a.model_name)}</h1>
{_TABS if a.graph is not None else ''}<div id="tab-report">
<p>Contribution weights c<sub>ij</sub> = ⟨o<sub>i</sub>, α<sub>ij</sub>ṽ<sub>j</sub>⟩ / ‖o<sub>i</sub>‖² = attention × relative norm × cosine,
with o<sub>i</sub> the layer's attention output (b<sub>O</sub> excluded): what each head moves, not only where it looks.
Red adds along the output, blue opposes it.</p>
<h2>Text</h2>{_text_block(a)}
<h2>Summary</h2><p class="mono">{summary}</p>
<h2>Attention sinks</h2>{fig_html[0]}
<p class="legend">Per layer: mean sink rate = attention on the first token, mean over heads and the queries after it;
sink heads = heads whose sink rate is above 0.3; first-token contribution = the first token's share of the layer's
attention output (heads summed), mean over the queries after it; closure error = how far heads × keys rebuild the
attention output (relative).</p>
{_table(["layer", "mean sink rate", "sink heads (>0.3)", "first-token contribution", "closure error"], sink_rows)}
<h2>Token level</h2>{fig_html[1]}
<h2>Per head</h2>{fig_html[2]}
<h2>Factor split for the last query ({html.escape(token_at(q, a.str_tokens))})</h2>
<p class="legend">The 5 (head, key) entries of largest |contribution| per layer: contribution = attention ×
relative norm (‖ṽ<sub>j</sub>‖ / ‖o<sub>i</sub>‖) × cosine (cos(o<sub>i</sub>, ṽ<sub>j</sub>)); key as position:token.</p>
{_table(["layer", "head", "key", "attention", "relative norm", "cosine", "contribution"], split_rows)}
<h2>Top contributing tokens per query (queries {a.window[0]}..{a.window[1] - 1})</h2>
<p class="legend">Per query and layer, the 3 keys of largest |contribution| (heads summed) as position:token and
contribution, among the keys the query sees{" (a decoder's query i sees keys 0..i: early queries list fewer)" if a.causal else ""}.</p>
{_table(["query"] + [f"layer {ly}" for ly in layers], top_rows)}
</div>
{_graph_section(a)}
</body></html>
"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
