"""Sink statistics per sample, layer and head as tidy tables.

One row per ``(sample, layer, head)``, each value a mean over the real queries after the
sink (in a decoder the sink query can only attend to itself). The sink is the first real
token of each row (the first position where ``attention_mask`` is 1, for left- and
right-padded batches alike), or a set of positions counted from it
(``sink_positions=(0, 1)``: the first two real tokens). Pad queries and pad keys never
count, so a row's statistics equal those of the text run alone.

Columns (docs/sinks.md, "Columns", defines each once; :class:`cwlens.reducers.HeadSummary`
reports ``sink_rate``, ``sink_contribution_intra`` and ``sink_contribution_inter`` with
the same definitions, tested equal):

- ``sink_rate``: attention mass on the sink positions; ``sink_head``: ``sink_rate > eps``
  (Gu et al., ICLR 2025, use ``eps = 0.3``); ``n_queries``: the queries averaged over.
- ``sink_contribution_intra`` (mean) and ``sink_contribution_intra_median``: the sink
  positions' intra-head contribution weight ``c_i0^h`` (a share of the head's own
  output); ``sink_contribution_inter``: their inter-head weight (a share of the layer
  output; summed over heads it is the sink token's contribution to the layer). Both
  whatever ``kind`` is.
- ``split_sink_*`` / ``split_tail_*``: the factor split ``c = attention x relative_norm
  x cosine`` under ``kind`` (column ``kind``, intra by default) of the first sink token and
  the per-token means over the tail tokens ``sink < j <= i``.
"""

import pandas as pd
import torch

from cwlens.core._types import Kind
from cwlens.core.geometry import AttentionGeometry, check_kind
from cwlens.core.sinks import first_real_index, key_onehot, query_after_sink
from cwlens.engine import adapter, validation
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.errors import InvalidArgumentError
from cwlens.sinks.config import EPS_GU as EPS_GU  # Gu et al.'s sink threshold
from cwlens.sinks.config import check_eps

FACTORS = ("attention", "relative_norm", "cosine", "contribution")


def check_sink_options(sink_positions, eps) -> None:
    """``sink_positions``: offsets from the sink, non-negative ints, each once (a position
    past the text was clamped onto its last token); ``eps`` in [0, 1]."""
    offsets = validation.int_list(sink_positions, "sink_positions")
    if any(x < 0 for x in offsets):
        raise InvalidArgumentError(f"sink_positions are offsets after the sink (0 = the sink "
                                   f"itself), so 0 or more; got {list(sink_positions)!r}.")
    check_eps(eps)


def sink_key_mask(sink_index: torch.Tensor, n_key: int, sink_positions=(0,)) -> torch.Tensor:
    """``[batch, key_pos]`` bool: the sink positions of each row (offsets from its sink)."""
    out = torch.zeros(sink_index.shape[0], n_key, dtype=torch.bool, device=sink_index.device)
    for off in sink_positions:
        out |= key_onehot((sink_index + off).clamp_max(n_key - 1), n_key)
    return out


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, dim) -> torch.Tensor:
    mask = mask.to(x.dtype)
    return (x * mask).sum(dim) / mask.sum(dim).clamp_min(1)


def _masked_median(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Median over the last axis of the entries where ``mask`` (NaN where none)."""
    y = torch.where(mask, x, torch.full_like(x, float("nan")))
    return y.nanmedian(-1).values


def layer_statistics(
    geo: AttentionGeometry,
    sink_index: torch.Tensor,
    sink_positions=(0,),
    kind: Kind = "intra",
    causal: bool = True,
) -> dict[str, torch.Tensor]:
    """The per-``(batch, head)`` columns of :func:`sink_statistics` for one layer.

    Only real queries after the sink count and the tail is the real keys after the sink
    (``j <= i`` where ``causal``; every real key for encoders), read from
    ``geo.position_mask``, so the result of a row does not depend on its padding.
    """
    check_kind(kind)
    b, h, q, k = geo.pattern.shape
    last = max(sink_positions)
    if bool((sink_index + last >= k).any()):  # it was clamped onto the last token
        raise InvalidArgumentError(
            f"sink_positions reach offset {last} after the sink, past the end of a row of {k} "
            "positions: give offsets inside the texts (0 = the sink itself).")
    real = geo.position_mask
    queries = query_after_sink(sink_index + last, q, k, real)[:, None, :].expand(b, h, q)
    sinks = sink_key_mask(sink_index, k, sink_positions)  # [b, k]
    first = key_onehot(sink_index, k)  # [b, k]
    qpos = torch.arange(k - q, k, device=sinks.device)
    kpos = torch.arange(k, device=sinks.device)
    tail = ~sinks[:, None, :].expand(b, q, k)  # [b, q, k]
    if causal:
        tail = tail & (kpos[None, None, :] <= qpos[None, :, None])
    if real is not None:
        tail = tail & real[:, None, :]
    tail = tail & (kpos[None, None, :] > sink_index[:, None, None] + last)
    tail = tail[:, None].expand(b, h, q, k)

    intra = geo.contribution("intra")
    values = {
        "attention": geo.attention(),
        "relative_norm": geo.relative_norm(kind),
        "cosine": geo.cosine(kind),
        "contribution": intra if kind == "intra" else geo.contribution(kind),
    }
    out = {
        "sink_rate": _masked_mean((geo.pattern * sinks[:, None, None]).sum(-1), queries, -1),
        "n_queries": queries.sum(-1).to(geo.pattern.dtype),
    }
    sink_c = (intra * sinks[:, None, None]).sum(-1)
    out["sink_contribution_intra"] = _masked_mean(sink_c, queries, -1)
    out["sink_contribution_intra_median"] = _masked_median(sink_c, queries)
    inter_c = (geo.contribution("inter") * sinks[:, None, None]).sum(-1)
    out["sink_contribution_inter"] = _masked_mean(inter_c, queries, -1)
    for name, x in values.items():
        at_sink = (x * first[:, None, None]).sum(-1)
        out[f"split_sink_{name}"] = _masked_mean(at_sink, queries, -1)
        per_query_tail = _masked_mean(x, tail, -1)
        out[f"split_tail_{name}"] = _masked_mean(per_query_tail, queries & tail.any(-1), -1)
    return out


@takes_model
def sink_statistics(
    cache,
    model: ModelLike,
    attention_mask: torch.Tensor | None = None,
    layers=None,
    sample_ids=None,
    eps: float = EPS_GU,
    sink_positions=(0,),
    kind: Kind = "intra",
) -> pd.DataFrame:
    """Tidy table, one row per ``(sample, layer, head)`` (see the module docstring)."""
    resolved, _ = adapter.resolve_requested_layers(model.n_layers, layers)
    check_sink_options(sink_positions, eps)
    if attention_mask is None:  # a padded batch's cache (cwlens.run_with_cache of texts)
        attention_mask = adapter.cache_mask(cache)
    causal = not model.is_encoder
    rows = [
        layer_frame(adapter.geometry(cache, model, ly, attention_mask), ly, attention_mask,
                    sample_ids, eps, sink_positions, kind, causal=causal)
        for ly in resolved
    ]
    return pd.concat(rows, ignore_index=True)


def layer_frame(
    geo, layer: int, attention_mask=None, sample_ids=None, eps: float = EPS_GU,
    sink_positions=(0,), kind: Kind = "intra", causal: bool = True,
) -> pd.DataFrame:
    """The rows of :func:`sink_statistics` for one layer's geometry (streaming-friendly);
    ``causal=False`` for encoders (every real key is in the tail)."""
    b = geo.pattern.shape[0]
    sink_index = first_real_index(
        None if attention_mask is None else attention_mask.bool(), b, geo.pattern.device
    )
    stats = layer_statistics(geo, sink_index, sink_positions, kind, causal=causal)
    df = _frame(stats, layer, sample_ids)
    df["sink_head"] = df["sink_rate"] > eps
    df["kind"] = kind
    return df


def _frame(stats: dict[str, torch.Tensor], layer: int, sample_ids) -> pd.DataFrame:
    b, h = next(iter(stats.values())).shape
    ids = list(range(b)) if sample_ids is None else list(sample_ids)
    data = {
        "sample": [ids[i] for i in range(b) for _ in range(h)],
        "layer": layer,
        "head": [j for _ in range(b) for j in range(h)],
    }
    for name, t in stats.items():
        data[name] = t.detach().float().cpu().reshape(-1).numpy()
    return pd.DataFrame(data)


def _require_stats(stats, columns) -> None:
    """A non-empty table of :func:`sink_statistics` (an empty one raised KeyError 'layer')."""
    missing = [c for c in columns if not isinstance(stats, pd.DataFrame) or c not in stats.columns]
    if missing or len(stats) == 0:
        raise InvalidArgumentError(
            "stats must be a non-empty table of cwlens.sinks.sink_statistics (one row per "
            "sample, layer and head)" + (f"; it lacks {', '.join(missing)}" if missing else
                                         "; it has no rows") + ".")


def head_summary(stats: pd.DataFrame, eps: float = EPS_GU) -> pd.DataFrame:
    """Mean over samples per ``(layer, head)``; ``sink_head`` re-thresholded on the mean rate."""
    _require_stats(stats, ("layer", "head", "sink_rate"))
    cols = [c for c in stats.columns if c not in ("sample", "layer", "head", "sink_head", "kind")]
    out = stats.groupby(["layer", "head"], as_index=False)[cols].mean()
    out["sink_head"] = out["sink_rate"] > eps
    return out


def layer_summary(stats: pd.DataFrame, eps: float = EPS_GU) -> pd.DataFrame:
    """Per layer: mean head sink rate, the sink token's share of the layer output
    (``sink_contribution_inter`` summed over heads), sink heads, factor means."""
    _require_stats(stats, ("sample", "layer", "sink_rate", "sink_contribution_inter"))
    per_sample = stats.groupby(["sample", "layer"], as_index=False).agg(
        sink_rate=("sink_rate", "mean"),
        sink_token_contribution=("sink_contribution_inter", "sum"),
    )
    by_layer = per_sample.groupby("layer", as_index=False)[
        ["sink_rate", "sink_token_contribution"]
    ].mean()
    heads = head_summary(stats, eps)
    factor_cols = [f"split_{w}_{f}" for w in ("sink", "tail") for f in FACTORS]
    extra = heads.groupby("layer", as_index=False).agg(
        n_sink_heads=("sink_head", "sum"),
        max_head_sink_rate=("sink_rate", "max"),
        **{c: (c, "mean") for c in factor_cols + ["sink_contribution_intra_median"]},
    )
    return by_layer.merge(extra, on="layer")
