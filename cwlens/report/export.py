"""Streamed reductions as tidy tables (pandas, Parquet) and a CircuitsVis view.

:func:`reduction_tables` turns a :class:`~cwlens.engine.streaming.StreamResult` of one text into
long tables, one row per number, with the model, the text id and the token strings:

=================  ==========================================================================
table              columns (besides ``model, text_id``)
=================  ==========================================================================
``topk``           ``metric, layer, head, query, rank, key, value, query_token, key_token`` (the ``k`` largest values)
``column_sums``    ``metric, layer, head, key, value, key_token`` (``head = -1``: heads summed)
``token_level``    ``metric, layer, query, key, value, query_token, key_token``
``heads``          ``layer, head, sink_rate, sink_contribution_intra, sink_contribution_inter, entropy, output_share`` (docs/sinks.md, "Columns")
=================  ==========================================================================

:func:`export_texts` runs the streaming engine on texts (one at a time: no padding) and
writes one Parquet file per table (``pip install pyarrow``); :func:`read_tables` reads them
back. :func:`circuitsvis_heads` shows contribution weights (or any ``[head, query, key]``
weights) in ``circuitsvis.attention.attention_heads`` (``pip install circuitsvis``), with the
widget's JavaScript inlined so that it works offline (:mod:`cwlens.report.circuitsvis`).
"""

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import torch

from cwlens.engine import batching, reducers, validation
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle
from cwlens.engine.streaming import check_metric, stream_reduce
from cwlens.errors import (
    CwlensError,
    EmptyInputError,
    InvalidArgumentError,
    LayerOutOfRangeError,
    ShapeMismatchError,
    UnknownOptionError,
)
from cwlens.report.circuitsvis import offline_view
from cwlens.runs.paths import output_dir
from cwlens.runs.progress import tick
from cwlens.runs.results_io import atomic_write

TABLES = ("topk", "column_sums", "token_level", "heads")


def _topk_rows(res: reducers.TopKResult, tokens: list[str], causal: bool) -> pd.DataFrame:
    idx, val = res.indices[:, 0].long(), res.values[:, 0]  # [layer, head, query, k]
    n_l, n_h, n_q, k = idx.shape
    grid = torch.meshgrid(torch.arange(n_l), torch.arange(n_h), torch.arange(n_q), torch.arange(k),
                          indexing="ij")
    layer, head, query, rank = (g.flatten() for g in grid)
    key = idx.flatten()
    keep = (key >= 0) & (key < len(tokens))  # -1: a row with fewer keys than k (TopKResult.valid)
    if causal:  # nor, on a decoder, the keys after the query (0 in every measure): a query
        keep &= key <= query  # with fewer than k keys listed them at ranks with value 0
    df = pd.DataFrame({
        "metric": res.metric if not res.by_abs else f"{res.metric} (ranked by |value|)",
        "layer": torch.tensor(res.layers)[layer].numpy(),
        "head": head.numpy() if n_h > 1 else -1,
        "query": query.numpy(), "rank": rank.numpy(), "key": key.numpy(),
        "value": val.flatten().float().numpy(),
    })[keep.numpy()]
    df["query_token"] = [tokens[i] for i in df["query"]]
    df["key_token"] = [tokens[i] for i in df["key"]]
    return df.reset_index(drop=True)


def _column_rows(res: reducers.LayerTensor, tokens: list[str]) -> pd.DataFrame:
    t = res.tensor[:, 0]  # [layer, head, key] or [layer, key]
    if t.ndim == 2:
        t = t[:, None]
        heads = [-1]
    else:
        heads = list(range(t.shape[1]))
    n_l, n_h, n_k = t.shape
    layer, head, key = (g.flatten() for g in torch.meshgrid(
        torch.arange(n_l), torch.arange(n_h), torch.arange(n_k), indexing="ij"))
    return pd.DataFrame({
        "metric": res.metric, "layer": torch.tensor(res.layers)[layer].numpy(),
        "head": torch.tensor(heads)[head].numpy(), "key": key.numpy(),
        "value": t.flatten().float().numpy(), "key_token": [tokens[i] for i in key.tolist()],
    })


def _token_rows(res: reducers.LayerTensor, tokens: list[str]) -> pd.DataFrame:
    t = res.tensor[:, 0]  # [layer, query, key]
    n_l, n_q, n_k = t.shape
    layer, query, key = (g.flatten() for g in torch.meshgrid(
        torch.arange(n_l), torch.arange(n_q), torch.arange(n_k), indexing="ij"))
    return pd.DataFrame({
        "metric": res.metric, "layer": torch.tensor(res.layers)[layer].numpy(),
        "query": query.numpy(), "key": key.numpy(), "value": t.flatten().float().numpy(),
        "query_token": [tokens[i] for i in query.tolist()],
        "key_token": [tokens[i] for i in key.tolist()],
    })


def reduction_tables(result, str_tokens: Sequence[str], model: str = "model",
                     text_id: str = "0", causal: bool = False) -> dict[str, pd.DataFrame]:
    """Tidy tables (see the module docstring) of a one-text :class:`StreamResult`.

    ``causal=True`` (a decoder's result; :func:`export_texts` sets it from the model)
    leaves out the top-k entries of keys after their query: :class:`~cwlens.reducers.TopK`
    ranks a row as the dense ``torch.topk`` would, so a query with fewer than ``k`` keys
    fills its row with those keys' zeros."""
    if isinstance(str_tokens, str | bytes):
        raise InvalidArgumentError("str_tokens must be a list of token strings (e.g. "
                                   "model.to_str_tokens(text)); got one string.")
    tokens = [str(t) for t in str_tokens]
    _check_one_text(result, len(tokens))
    parts: dict[str, list[pd.DataFrame]] = {name: [] for name in TABLES}
    for value in result.results.values():
        if isinstance(value, reducers.TopKResult):
            parts["topk"].append(_topk_rows(value, tokens, validation.flag(causal, "causal")))
        elif isinstance(value, reducers.LayerTensor) and (
                value.kind == "token_level" or not value.kind and value.tensor.ndim == 4
                and value.tensor.shape[-1] == value.tensor.shape[-2] == len(tokens)):
            parts["token_level"].append(_token_rows(value, tokens))
        elif isinstance(value, reducers.LayerTensor):
            parts["column_sums"].append(_column_rows(value, tokens))
        elif isinstance(value, reducers.HeadSummaryResult):
            parts["heads"].append(value.to_dataframe().drop(columns=["sample"]))
    out = {}
    for name, frames in parts.items():
        if frames:
            df = pd.concat(frames, ignore_index=True)
            df.insert(0, "text_id", str(text_id))
            df.insert(0, "model", model)
            out[name] = df
    return out


def _check_one_text(result, n_tokens: int) -> None:
    values = getattr(result, "results", None)
    if not isinstance(values, dict):
        raise InvalidArgumentError(f"result must be a StreamResult from cwlens.stream_reduce; got "
                                   f"{type(result).__name__}.")
    for name, value in values.items():
        if isinstance(value, reducers.TopKResult):
            batch, n = value.indices.shape[1], value.indices.shape[3]
        elif isinstance(value, reducers.LayerTensor):
            batch, n = value.tensor.shape[1], value.tensor.shape[-1]
        elif isinstance(value, reducers.HeadSummaryResult):
            batch, n = value.sink_rate.shape[1], n_tokens
        else:
            continue
        if batch != 1:
            raise ShapeMismatchError(f"{name!r} holds {batch} texts: reduction_tables takes the "
                                     "result of one text (stream them one at a time).")
        if n != n_tokens:
            raise ShapeMismatchError(f"{name!r} covers {n} tokens but str_tokens has {n_tokens}: "
                                     "pass the str_tokens of the streamed tokens "
                                     "(model.to_str_tokens(tokens[0])).")


def default_reducers(metrics: Sequence[str] = ("contribution", "attention"), k: int = 8,
                     token_layers: Sequence[int] = ()) -> list:
    """Per-row top-``k`` and column sums of each metric, head summaries, and the
    token-level matrices of ``token_layers``. The top-``k`` of a metric is its ``k``
    largest values (:class:`~cwlens.reducers.TopK`'s rule; a signed contribution's
    opposing keys are not among them: add ``contribution_abs`` for the largest in
    magnitude)."""
    rs: list = []
    for m in metrics:
        rs += [reducers.TopK(k, m), reducers.ColumnSums(m)]  # by value: TopK's rule
    rs.append(reducers.HeadSummary())
    if token_layers:
        rs.append(reducers.TokenLevel(token_layers))
    return rs


@takes_model
def export_texts(model: ModelLike, texts: Sequence[str], out_dir, model_name: str = "model",
                 text_ids: Sequence[str] | None = None, max_tokens: int | None = None,
                 fmt: str = "parquet", past_context: bool = False, **reduce) -> dict[str, Path]:
    """Stream each text, reduce it, and write the tables to ``out_dir/<table>.<fmt>``
    (``fmt``: ``"parquet"`` or ``"csv"``). Returns ``{table: path}``; the tables of an
    earlier export in ``out_dir`` that this one does not write are removed, so
    :func:`read_tables` reads this export alone. Texts past the
    model's context are cut there, unless ``past_context`` (rotary models only;
    docs/inputs.md).

    ``reduce``: the options of :func:`default_reducers` (``metrics``, ``k``,
    ``token_layers``)."""
    texts, ids, reduce = _check_export(model, texts, out_dir, text_ids, max_tokens, fmt, reduce)
    batching.check_past_context(model.info, past_context)

    causal = not model.is_encoder
    tables: dict[str, list[pd.DataFrame]] = {}
    for text, tid in zip(texts, ids, strict=True):
        tokens = batching.fit_context(model, model.to_tokens(text, truncate=False),
                                      max_tokens, f"text {tid}", past_context)
        with validation.past_context_said(past_context):  # fit_context said it
            res = stream_reduce(model, tokens, default_reducers(**reduce))
        str_tokens = model.to_str_tokens(tokens[0])
        for name, df in reduction_tables(res, str_tokens, model_name, tid, causal).items():
            tables.setdefault(name, []).append(df)
        tick()  # progress: one text (cwlens.runs.progress)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    paths = {}
    for name, frames in tables.items():
        df = pd.concat(frames, ignore_index=True)
        path = out / f"{name}.{fmt}"
        atomic_write(path, _writer(df, fmt))
        paths[name] = path
    for name in TABLES:  # an earlier export's tables would be read back beside these
        for old_fmt in ("parquet", "csv"):
            stale = out / f"{name}.{old_fmt}"
            if stale not in paths.values() and stale.is_file():
                stale.unlink()
    return paths


def _check_export(handle: ModelHandle, texts, out_dir, text_ids, max_tokens, fmt, reduce: dict):
    """Every argument of :func:`export_texts`, before any model work: ``(texts, ids,
    reduce)`` (``reduce`` with every option of :func:`default_reducers`, negative
    ``token_layers`` counted from the end)."""
    if fmt not in ("parquet", "csv"):
        raise UnknownOptionError(f"fmt must be 'parquet' or 'csv'; got {fmt!r}.")
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise InvalidArgumentError(
            f"texts must be a list of strings; got {type(texts).__name__} (a single text: "
            "pass [text]).")
    if not texts:
        raise EmptyInputError("texts is empty: pass at least one text to export.")
    for i, t in enumerate(texts):
        validation.text(t, f"text {i}")
    if isinstance(text_ids, str | bytes):
        raise InvalidArgumentError(f"text_ids must be a list of ids, one per text; got the string "
                                   f"{text_ids!r} (a single text: text_ids=[{text_ids!r}]).")
    ids = [str(i) for i in range(len(texts))] if text_ids is None else [str(i) for i in text_ids]
    if len(ids) != len(texts):
        raise ShapeMismatchError(f"text_ids has {len(ids)} ids for {len(texts)} texts: give one "
                                 "id per text (or None for 0, 1, ...).")
    if len(set(ids)) != len(ids):
        raise InvalidArgumentError("text_ids lists an id twice: the tables could not tell those "
                                   "texts apart; give each text its own id.")
    unknown = sorted(set(reduce) - {"metrics", "k", "token_layers"})
    if unknown:
        raise InvalidArgumentError(f"export_texts got an unknown option {unknown[0]!r}: the "
                                   "reduction options are metrics, k and token_layers.")
    metrics = reduce.get("metrics", ("contribution", "attention"))
    k, token_layers = reduce.get("k", 8), reduce.get("token_layers", ())
    if isinstance(metrics, str) or not list(metrics):
        raise InvalidArgumentError(f"metrics must be a non-empty list of metric names, e.g. "
                                   f"('contribution', 'attention'); got {metrics!r}.")
    for m in metrics:
        check_metric(m)
    if len(set(metrics)) != len(list(metrics)):
        raise InvalidArgumentError(f"metrics lists a metric twice: {metrics!r}; give each once.")
    validation.positive_int(k, "k")
    validation.max_tokens(max_tokens)
    if max_tokens == 1:
        raise InvalidArgumentError(
            "max_tokens=1 keeps one token of each text (its first, e.g. <bos>): one query that "
            "sees only itself has every weight 1, and nothing of the text is exported. Pass "
            "max_tokens of 2 or more (CLI: --max-tokens).")
    n_layers = handle.n_layers
    layers = validation.int_list(token_layers, "token_layers", allow_empty=True)
    bad = [ly for ly in layers if not -n_layers <= ly < n_layers]
    if bad:
        raise LayerOutOfRangeError(f"token_layers {bad} out of range: the model has layers "
                                   f"0..{n_layers - 1}.")
    output_dir(out_dir, "out_dir")
    if fmt == "parquet":
        _require("pyarrow", "Parquet export", "pip install pyarrow (or cwlens[export])")
    reduce = {"metrics": tuple(metrics), "k": k, "token_layers": [ly % n_layers for ly in layers]}
    return list(texts), ids, reduce


def _writer(df: pd.DataFrame, fmt: str):
    def write(tmp: Path) -> None:
        if fmt == "parquet":
            df.to_parquet(tmp, index=False)
        else:
            df.to_csv(tmp, index=False)

    return write


TEXT_COLUMNS = ("model", "text_id", "metric", "query_token", "key_token", "token")


def _read_csv(path) -> pd.DataFrame:
    """A CSV export as its Parquet twin reads: ids and tokens stay strings (pandas' defaults
    read the text id '007' as 7 and the tokens 'NA', 'null' or '' as NaN)."""
    header = pd.read_csv(path, nrows=0).columns
    text = [c for c in header if c in TEXT_COLUMNS]
    frame = pd.read_csv(path, dtype={c: str for c in text}, keep_default_na=False,
                        na_values={c: ["", "NaN", "nan", "NA", "N/A", "null", "None", "<NA>"]
                                   for c in header if c not in text})
    return frame


def read_tables(out_dir) -> dict[str, pd.DataFrame]:
    """The tables :func:`export_texts` wrote (Parquet or CSV)."""

    out = {}
    for name in TABLES:
        for fmt, reader in (("parquet", pd.read_parquet), ("csv", _read_csv)):
            path = Path(out_dir) / f"{name}.{fmt}"
            if path.exists():
                out[name] = reader(path)
    if not out:
        raise InvalidArgumentError(
            f"{str(out_dir)!r} holds no exported tables ({', '.join(TABLES)} .parquet/.csv): pass "
            "the out_dir of export_texts (or cwlens export --out).")
    return out


def weights_kind(weights: torch.Tensor, atol: float = 1e-3) -> str:
    """Which kind ``[head, query, key]`` contribution weights are, from their sums:
    ``"intra"`` (each head's rows sum to 1, or are 0), ``"inter"`` (the heads' rows sum
    to 1 together), else ``"other"`` (attention, a part of the keys, ...)."""
    w = weights.detach().float()
    rows = w.sum(-1)
    if bool((((rows - 1).abs() < atol) | (w.abs().sum(-1) == 0)).all()):
        return "intra"
    if bool(((rows.sum(0) - 1).abs() < atol).all()):
        return "inter"
    return "other"


KIND_TITLES = {
    "intra": "contribution weights, intra-head (each head's row sums to 1)",
    "inter": "contribution weights, inter-head (a head's row sums to its share of the layer "
             "output, not 1: faint next to attention; kind=\"intra\" to compare a head with it)",
    "other": "weights",
}


def circuitsvis_heads(weights: torch.Tensor, str_tokens: Sequence[str], signed: bool = True,
                      title: str | None = None):
    """``circuitsvis.attention.attention_heads`` of ``[head, query, key]`` weights (e.g.
    contribution weights of one text and layer), for notebook users who know that widget.

    Returns a :class:`~cwlens.report.circuitsvis.CircuitsVisView` whose JavaScript is
    inlined (circuitsvis' own ``str(view)`` loads it from a CDN and shows a blank page
    offline): it shows itself in a notebook, and ``view.save("view.html")`` writes a page
    that opens from disk without network (``title``: the page's heading; default: the
    weights' kind, read from their sums by :func:`weights_kind`, named as
    :data:`KIND_TITLES` does).

    Pass ``kind="intra"`` weights (``contribution_weights(..., kind="intra")``) to compare
    a head with its attention: each head's row sums to 1. The default ``"inter"`` weights
    sum to 1 over heads *and* keys, so one head's row holds only its share of the layer
    output (about -0.06..0.33 on SmolLM2) and its view looks nearly blank.

    The widget expects non-negative weights: ``signed=True`` (default) passes signed
    contribution weights as they are, which the widget draws with negative cells clipped;
    ``signed=False`` shows ``|c|``. ``str_tokens``: one string per query (a bare string is
    refused: it would be read character by character)."""
    if not isinstance(weights, torch.Tensor):
        raise InvalidArgumentError(f"weights must be a [head, query, key] tensor; got "
                                   f"{type(weights).__name__}.")
    if isinstance(str_tokens, str | bytes):
        raise InvalidArgumentError("str_tokens must be a list of token strings (e.g. "
                                   "model.to_str_tokens(text)); got one string.")
    w = weights.detach().float().cpu()
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3:
        raise ShapeMismatchError(f"weights must be [head, query, key] or [query, key]; got "
                                 f"{tuple(weights.shape)}.")
    if not w.shape[1] == w.shape[2] == len(str_tokens):
        raise ShapeMismatchError(f"weights are {tuple(weights.shape)} but str_tokens has "
                                 f"{len(str_tokens)} tokens: pass the tokens of those queries and keys.")
    _require("circuitsvis", "The CircuitsVis view", "pip install circuitsvis")
    from circuitsvis.attention import attention_heads  # optional: circuitsvis (the viz extra)

    rendered = attention_heads(attention=w if signed else w.abs(), tokens=[str(t) for t in str_tokens])
    return offline_view(rendered, str(title) if title is not None else KIND_TITLES[weights_kind(w)])


def _require(module: str, what: str, fix: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise CwlensError(f"{what} needs the optional package {module!r}: {fix}.")
