"""Attention vs contribution heatmaps (the paper's Fig. 1 layout).

Attention matrices on the top row, contribution matrices on the bottom row, one column
per head; contributions use a diverging scale centred at 0 (red = adds along the
output, blue = opposes it). Hover shows the factor split. Masked cells (a decoder's keys
after the query) are drawn in :data:`MASKED_COLOUR`, apart from the colour of a 0.
"""

import numpy as np

MASKED_COLOUR = "#b8b8b8"  # NaN cells are transparent: the plot background shows through
MASKED_NOTE = "grey: masked (key after the query), no weight at all; a 0 is drawn in the colour scale"


def causal_mask(n_queries: int, n_keys: int | None = None, start: int = 0) -> np.ndarray:
    """``[query, key]`` bool: True where a decoder's query cannot see the key (key after the
    query); queries and keys both numbered from ``start``."""
    n_keys = n_queries if n_keys is None else n_keys
    return np.arange(n_keys)[None, :] > np.arange(n_queries)[:, None]


def with_masked(values, masked) -> np.ndarray:
    """``values`` as floats, NaN where ``masked`` (drawn as :data:`MASKED_COLOUR`)."""
    out = np.array(values, dtype=float)
    if masked is not None:
        out[np.asarray(masked, dtype=bool)] = np.nan
    return out


def token_labels(str_tokens, start: int = 0) -> list[str]:
    """``"i:token"`` axis labels (``i`` from ``start``): plotly merges equal category labels,
    so make each unique."""
    return [f"{i}:{t!s}".replace("\n", "\\n") for i, t in enumerate(str_tokens, start)]


def attention_vs_contribution(
    heads: list[dict],
    str_tokens: list[str],
    title: str = "Where heads look (attention) vs what they move (contribution)",
    contribution_label: str = "contribution (intra-head)",
    masked=None,
):
    """A 2-row figure: attention (top) and contribution (bottom) for each head.

    Args:
        heads: one dict per column with ``name`` and ``[query, key]`` arrays
            ``attention``, ``contribution``, and optionally ``relative_norm``, ``cosine``
            for the hover text.
        str_tokens: token strings of the sequence (axis labels).
        contribution_label: names the kind of the contribution rows (the bottom titles):
            ``"contribution (intra-head)"`` (default: each head's row sums to 1, like
            attention) or ``"contribution (inter-head)"`` (a head's row sums to its share
            of the layer output, e.g. -0.06..0.33, not to 1).
        masked: ``[query, key]`` bool, True on the cells no query sees (a decoder's keys
            after the query: :func:`causal_mask`), drawn grey, apart from zeros; None: none.
    """
    import plotly.graph_objects as go  # heavy: plotly, imported on use
    from plotly.subplots import make_subplots

    n = len(heads)
    labels = token_labels(str_tokens)
    fig = make_subplots(
        rows=2,
        cols=n,
        subplot_titles=[f"{h['name']}: attention" for h in heads]
        + [f"{h['name']}: {contribution_label}" for h in heads],  # names the kind
        horizontal_spacing=0.04,
        vertical_spacing=0.12,
    )
    c_max = max(float(np.nanmax(np.abs(with_masked(h["contribution"], masked)))) for h in heads) or 1.0
    for col, head in enumerate(heads, start=1):
        att = with_masked(head["attention"], masked)
        con = with_masked(head["contribution"], masked)
        hover = _hover(head, labels, masked)
        fig.add_trace(
            go.Heatmap(
                z=att, x=labels, y=labels, colorscale="Viridis", zmin=0, zmax=1,
                showscale=col == n, colorbar=dict(title="attention", y=0.78, len=0.42),
                customdata=hover, hovertemplate="%{customdata}<extra></extra>",
            ),
            row=1, col=col,
        )
        fig.add_trace(
            go.Heatmap(
                z=con, x=labels, y=labels, colorscale="RdBu_r", zmid=0,
                zmin=-c_max, zmax=c_max, showscale=col == n,
                colorbar=dict(title=contribution_label.split(" ")[0], y=0.22, len=0.42),
                customdata=hover, hovertemplate="%{customdata}<extra></extra>",
            ),
            row=2, col=col,
        )
    side = max(300, 22 * len(labels))
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=9), showgrid=False, zeroline=False)
    for row in (1, 2):  # only the first column: an inner one's title would sit on the
        fig.update_yaxes(title_text="query", row=row, col=1)  # tick labels of its left neighbour
    fig.update_xaxes(tickfont=dict(size=9), tickangle=-60, title_text="key", showgrid=False, zeroline=False)
    if masked is not None and np.asarray(masked).any():
        title = f"{title}<br><sup>{MASKED_NOTE}</sup>"
    fig.update_layout(
        title=title, width=min(2400, 120 + side * n), height=2 * side + 220,
        font=dict(size=11), margin=dict(t=80 + 22 * title.count("<br>")),  # a line per <br>
        plot_bgcolor=MASKED_COLOUR,
    )
    return fig


def _hover(head, labels, masked=None):
    att = np.asarray(head["attention"], dtype=float)
    con = np.asarray(head["contribution"], dtype=float)
    rel = np.asarray(head.get("relative_norm", np.full_like(att, np.nan)), dtype=float)
    cos = np.asarray(head.get("cosine", np.full_like(att, np.nan)), dtype=float)
    out = np.empty(att.shape, dtype=object)
    hidden = np.zeros(att.shape, dtype=bool) if masked is None else np.asarray(masked, dtype=bool)
    for i in range(att.shape[0]):
        for j in range(att.shape[1]):
            if hidden[i, j]:
                out[i, j] = f"query {labels[i]}<br>key {labels[j]}<br>masked: the query does not see this key"
                continue
            out[i, j] = (
                f"query {labels[i]}<br>key {labels[j]}<br>attention {att[i, j]:.3f}"
                f"<br>relative norm {rel[i, j]:.3f}<br>cosine {cos[i, j]:+.3f}"
                f"<br>contribution {con[i, j]:+.3f}"
            )
    return out
