"""Everything the report (and the demo) shows about one text, from one streamed forward pass.

Long texts are fine: while the model runs, each layer is reduced to what is drawn
(:func:`analyze_text`), so memory and the report's size do not grow as ``layers x n^2``:

- over **all** tokens: per-(layer, head) sink rate, the first token's token-level
  contribution per layer, the top-``k`` contributing tokens of every query (by ``|c|``,
  heads summed), the full factor split of the **last** query, the identity checks (sums,
  closure);
- at full resolution, every head's attention / contribution / relative norm / cosine on
  a **window** of ``window`` tokens (queries and keys; by default the last 64 tokens).
"""

from dataclasses import dataclass, field
from typing import Any

import torch

from cwlens.core.geometry import AttentionGeometry, check_kind
from cwlens.core.numerics import worst
from cwlens.engine import reducers, validation
from cwlens.engine.batching import fit_context
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.streaming import pass_options, stream_reduce
from cwlens.errors import InvalidArgumentError
from cwlens.graphs.build import GraphEdges, assemble
from cwlens.report.printed import entry_list, listed_entries, token_at
from cwlens.runs.progress import tick

FACTORS = ("attention", "relative_norm", "cosine", "contribution")
DEFAULT_WINDOW = 64


@dataclass(frozen=True)
class TextAnalysis:
    """Per-layer attention vs contribution of one text (batch of 1), as CPU tensors.

    Inter-head throughout (``o`` is the layer's attention output, b_O excluded), except
    ``head_factors``: with ``head_kind="intra"`` (:func:`analyze_text`'s default) the
    window's ``{"contribution", "relative_norm", "cosine"}`` against each head's *own*
    output (each head's row sums to 1), which the report's per-head view compares with
    attention; an inter weight of one head sums to that head's share of the layer output
    (about -0.06..0.33 on SmolLM2), not to 1 (:meth:`head_view`).

    ``attention``/``contribution``/``relative_norm``/``cosine``: ``[layer, head, w, w]`` on
    the window positions ``window = (start, stop)`` (queries and keys both in it).
    ``last_query``: ``{factor: [layer, head, key]}``, every key of the last query.
    ``sink_rate``: ``[layer, head]`` mean attention on the first token over the queries
    after it (the names of docs/sinks.md, "Columns"); ``sink_attention``: its mean over
    heads, ``[layer]``; ``sink_token_contribution``: ``[layer]`` the first token's
    token-level (heads summed, inter) contribution, mean over the queries after it.
    ``top_keys`` / ``top_values``: ``[layer, query, k]`` top contributing tokens (|c|, heads
    summed) among the keys each query sees; a query that sees fewer than ``k`` keys (a
    decoder's early queries) has its other entries marked ``-1`` / NaN.
    ``causal``: a decoder (query ``i`` sees keys ``0..i``); False for an encoder.
    """

    model_name: str
    text: str
    str_tokens: list[str]
    window: tuple[int, int]
    attention: torch.Tensor
    contribution: torch.Tensor
    relative_norm: torch.Tensor
    cosine: torch.Tensor
    last_query: dict[str, torch.Tensor]
    sink_rate: torch.Tensor
    sink_attention: torch.Tensor
    sink_token_contribution: torch.Tensor
    top_keys: torch.Tensor
    top_values: torch.Tensor
    closure_error: tuple[float, ...]
    sum_error: float
    intra_sum_error: float
    notes: list[str] = field(default_factory=list)
    causal: bool = True
    head_kind: str = "inter"
    head_factors: dict[str, torch.Tensor] = field(default_factory=dict)

    def head_view(self) -> dict[str, torch.Tensor]:
        """``{"attention", "contribution", "relative_norm", "cosine"}``, ``[layer, head, w,
        w]`` on the window, of the kind :attr:`head_kind` (the per-head heatmaps)."""
        inter = {"attention": self.attention, "contribution": self.contribution,
                 "relative_norm": self.relative_norm, "cosine": self.cosine}
        return {**inter, **self.head_factors} if self.head_kind == "intra" else inter
    graph: Any = None  # the text's ContributionGraph (cwlens.graphs), or None

    @property
    def n_layers(self) -> int:
        return self.attention.shape[0]

    @property
    def n_heads(self) -> int:
        return self.attention.shape[1]

    @property
    def window_tokens(self) -> list[str]:
        return self.str_tokens[self.window[0] : self.window[1]]

    def token_contribution(self) -> torch.Tensor:
        """``[layer, w, w]`` on the window: heads summed (rows sum to 1 when the window
        starts at the first token; otherwise the keys before the window are left out)."""
        return self.contribution.sum(1)

    def top_tokens(self, layer: int, query: int, k: int = 5) -> list[tuple[int, str, float]]:
        """Top-k keys by |token contribution| for one query: (key, token, contribution),
        only keys the query sees (fewer than ``k`` for a decoder's early queries)."""
        entries = listed_entries(self.top_keys[layer, query], self.top_values[layer, query], query,
                                 len(self.str_tokens), self.causal)
        return [(j, self.str_tokens[j], c) for j, c in entries[:k]]

    def summary_lines(self, k: int = 3, layers: list[int] | None = None) -> list[str]:
        """The printed summary; the top tokens of ``layers`` (default: 4 spread over the
        depth, the report's default heatmap layers)."""
        q = len(self.str_tokens) - 1
        lines = [
            f"{self.model_name}: {len(self.str_tokens)} tokens, {self.n_layers} layers x {self.n_heads} heads",
            f"checks: weights sum to 1 within {self.sum_error:.1e}; heads x keys rebuild the "
            f"attention output within {worst(self.closure_error):.1e} (relative)",
            f"sink heads (mean attention on the first token > 0.3): "
            f"{int((self.sink_rate > 0.3).sum())} of {self.sink_rate.numel()}",
            f"top contributing tokens for the last query ({token_at(q, self.str_tokens)}; "
            "key:token, contribution of the token to the layer output, ranked by |contribution|, "
            "heads summed):",
        ]
        for layer in layers if layers is not None else _spread(self.n_layers, 4):
            tops = [(j, c) for j, _, c in self.top_tokens(layer, q, k)]
            lines.append(f"  layer {layer:>2}: {entry_list(tops, self.str_tokens, 2)}")
        lines += self.notes
        return lines


def _spread(n: int, k: int) -> list[int]:
    """``k`` layers spread from the first to the last (every layer when ``n <= k``)."""
    k = min(k, n)
    return sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(k)})


def _factors(geo: AttentionGeometry, keys: slice, intra: bool = False) -> dict[str, torch.Tensor]:
    """The four factors (inter) of a block's rows on ``keys``: ``{factor: [b, h, q, keys]}``;
    ``intra``: also the three of each head's own output (``<factor>_intra``)."""
    out = {
        "attention": geo.attention()[..., keys],
        "relative_norm": geo.relative_norm("inter")[..., keys],
        "cosine": geo.cosine("inter")[..., keys],
        "contribution": geo.contribution("inter")[..., keys],
    }
    if intra:
        out |= {f"{f}_intra": getattr(geo, f)("intra")[..., keys]
                for f in ("relative_norm", "cosine", "contribution")}
    return out


class _ReportReducer(reducers.Reducer):
    """What :class:`TextAnalysis` keeps of each layer (batch of one, no padding)."""

    metrics = ("attention", "contribution")

    def __init__(self, n: int, window: tuple[int, int], check_intra: bool, head_kind: str = "inter"):
        self.n, self.window, self.check_intra = n, window, check_intra
        self.head_kind = head_kind
        self.name = "report"
        self._win: dict[int, dict[str, list]] = {}
        self._last: dict[int, dict[str, torch.Tensor]] = {}
        self._sink_tail: dict[int, torch.Tensor] = {}  # [h, 2]: sums over queries >= 1
        self._err: dict[str, float] = {}

    def start_layer(self, layer, geometry):
        self._geo = geometry  # the layer's values: factors of window rows over all their keys

    def end_layer(self, layer, geometry):
        self._geo = None
        tick()  # progress: one layer streamed (cwlens.runs.progress)

    def update(self, layer, query_start, weights, block):
        a, c = weights["attention"], weights["contribution"]  # [1, h, bq, width]
        bq = a.shape[2]
        tail = (torch.arange(query_start, query_start + bq) >= 1).to(a.dtype)
        tail_sums = torch.stack([(a[0, :, :, 0] * tail).sum(-1), (c[0, :, :, 0] * tail).sum(-1)], -1)
        self._sink_tail[layer] = self._sink_tail.get(layer, 0) + tail_sums
        self._err["sum"] = worst([self._err.get("sum", 0.0), float((c.sum((1, 3)) - 1).abs().max())])
        if self.check_intra:
            intra = block.contribution("intra").sum(-1)  # [1, h, bq]: 1 where o^h != 0
            ok = ~block.zero_output("intra")
            err = ((intra - 1).abs() * ok).max() if ok.any() else torch.tensor(0.0)
            self._err["intra"] = worst([self._err.get("intra", 0.0), float(err)])
        w0, w1 = self.window
        r0, r1 = max(w0, query_start) - query_start, min(w1, query_start + bq) - query_start
        if r0 < r1:
            rows = _factors(self._all_keys(block, r0, r1, query_start), slice(w0, w1),
                            intra=self.head_kind == "intra")
            for key, val in rows.items():
                self._win.setdefault(layer, {}).setdefault(key, []).append((query_start, val[0].clone()))
        last = self.n - 1 - query_start
        if 0 <= last < bq:
            rows = _factors(self._all_keys(block, last, last + 1, query_start), slice(0, self.n))
            self._last[layer] = {key: val[0, :, 0].clone() for key, val in rows.items()}

    def _all_keys(self, block, r0: int, r1: int, query_start: int) -> AttentionGeometry:
        """Rows ``r0:r1`` of ``block`` over every key (a block may stop at its last query's
        key; the factors of the keys after it are not 0), from the layer's values."""
        rows = block.pattern[:, :, r0:r1]
        rows = torch.nn.functional.pad(rows, (0, self.n - rows.shape[-1]))
        return self._geo.with_rows(rows, query_start + r0)

    def result(self):
        return self


@takes_model
def analyze_text(
    model: ModelLike,
    text: str,
    model_name: str = "model",
    max_tokens: int | None = 4096,
    window: int | tuple[int, int] | None = DEFAULT_WINDOW,
    top_k: int = 5,
    check_intra: bool = False,
    past_context: bool = False,
    **options,
) -> TextAnalysis:
    """Run the model once on ``text`` (its first ``max_tokens`` tokens; None: all) and
    collect what the report shows. ``window``: the number of last tokens drawn at full
    resolution, or ``(start, stop)``, or None for every token. A text past the model's
    context is cut there, unless ``past_context`` (rotary models only; docs/inputs.md).
    ``options``' ``head_kind``: the contribution the per-head heatmaps compare with
    attention, ``"intra"`` (default: against the head's own output, each row sums to 1,
    like attention) or ``"inter"`` (against the layer's output: a head's row sums to its
    share).
    ``options``: the forward pass's ``query_block`` (default ``"auto"``: 256 rows up to 8192
    tokens, fewer above) and ``attention`` (see
    :func:`cwlens.stream_reduce`; ``"auto"``: blockwise above 2048 tokens), and
    ``graph_top_k`` (default 4): the report's contribution graph keeps that many edges per
    node besides the residual's, in the same pass (:mod:`cwlens.graphs`; 0: no graph)."""
    head_kind = options.pop("head_kind", "intra")
    graph_top_k = options.pop("graph_top_k", 4)  # 0: no graph
    if graph_top_k:
        validation.positive_int(graph_top_k, "graph_top_k")
    run = pass_options("analyze_text", {"query_block": "auto", **options}, ("attention", "query_block"))
    validation.text(text)
    if max_tokens is not None:
        validation.max_tokens(max_tokens)

    full = model.to_tokens(text, truncate=False)
    tokens = fit_context(model, full, max_tokens, "the text", past_context)
    n = tokens.shape[1]
    str_tokens = [str(t) for t in model.to_str_tokens(tokens[0])]
    if n == 1 and full.shape[1] > 1:
        raise InvalidArgumentError(
            f"max_tokens={max_tokens} keeps one token ({str_tokens[0]!r}) of the text's "
            f"{full.shape[1]}: one query that sees only itself has every weight 1, and "
            "nothing of the text is analysed. Pass max_tokens of 2 or more (CLI: --max-tokens).")
    if window is None:
        win = (0, n)
    elif isinstance(window, int):
        win = (max(0, n - window), n)
    else:
        win = (max(0, int(window[0])), min(n, int(window[1])))

    check_kind(head_kind)
    report = _ReportReducer(n, win, check_intra, head_kind)
    top = reducers.TopK(top_k, "contribution", by_abs=True, sum_heads=True, name="top")
    graph_parts = [] if not graph_top_k else [GraphEdges("contribution", graph_top_k),
                                              GraphEdges("attention", graph_top_k)]
    with validation.past_context_said(past_context):  # fit_context said it
        res = stream_reduce(model, tokens, [report, top, *graph_parts], query_block=run["query_block"],
                            closure=True, attention=run["attention"], logits=False)
    graph = assemble(res, graph_parts, str_tokens, model_name) if graph_parts else None
    layers = sorted(report._win)
    stack = lambda key: torch.stack(  # noqa: E731
        [reducers.in_query_order(report._win[ly][key], 1) for ly in layers]).cpu()
    sink_tail = torch.stack([report._sink_tail[ly] for ly in layers]).cpu()  # [L, h, 2]
    n_tail = max(n - 1, 1)
    causal = not model.is_encoder
    top_keys, top_values = _seen_only(res["top"], n, causal)
    notes = []
    if win != (0, n):
        notes.append(f"heatmaps show tokens {win[0]}..{win[1] - 1} of {n} (window); "
                     "every other number covers all tokens")
    return TextAnalysis(
        model_name=model_name,
        text=text,
        str_tokens=str_tokens,
        window=win,
        attention=stack("attention"),
        contribution=stack("contribution"),
        relative_norm=stack("relative_norm"),
        cosine=stack("cosine"),
        last_query={f: torch.stack([report._last[ly][f] for ly in layers]).cpu() for f in FACTORS},
        sink_rate=sink_tail[..., 0] / n_tail,
        sink_attention=sink_tail[..., 0].mean(-1) / n_tail,
        sink_token_contribution=sink_tail[..., 1].sum(-1) / n_tail,
        top_keys=top_keys,
        top_values=top_values,
        closure_error=res.closure.relative_error,
        sum_error=report._err.get("sum", 0.0),
        intra_sum_error=report._err.get("intra", float("nan")),
        notes=notes,
        causal=causal,
        head_kind=head_kind,
        head_factors={f: stack(f"{f}_intra") for f in ("relative_norm", "cosine", "contribution")}
        if head_kind == "intra" else {},
        graph=graph,
    )


def _seen_only(top, n: int, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``[layer, query, k]`` keys and values of a one-text :class:`~cwlens.reducers.TopK`
    result, with every entry that is not a key its query sees set to -1 / NaN: keys after
    the query on a decoder, and whatever the reducer marks (a ``valid`` mask, -1, NaN)."""
    keys = top.indices[:, 0, 0].long().cpu()
    values = top.values[:, 0, 0].float().cpu()
    query = torch.arange(keys.shape[1])[None, :, None]
    ok = (keys >= 0) & (keys < n) & values.isfinite()
    if causal:
        ok &= keys <= query
    valid = getattr(top, "valid", None)
    if valid is not None:
        ok &= valid[:, 0, 0].bool().cpu()
    return keys.masked_fill(~ok, -1), values.masked_fill(~ok, float("nan"))
