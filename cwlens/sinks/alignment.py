"""Anti-alignment: does the sink's projected value point against the tail's?

Three cosines per head, all with the sink's projected value ``v~_0^h``:

- ``value``: with each tail token's projected value ``v~_j^h`` (``j`` after the sink;
  one value per key, independent of the query);
- ``output``: with the head's output ``o_i^h`` (per query after the sink);
- ``tail_mix``: with the renormalised tail mixture ``B_i = (o_i - a_i0 v~_0)/(1 - a_i0)``
  (per query), the ``<A, B>`` of the sink-rate curve.

:func:`alignment_statistics` gives one row per ``(sample, layer, head)`` with the mean and
the fraction of negative cosines; :func:`cosine_histograms` gives per-layer histogram
counts (add them over batches) for the distribution figure.
"""

import pandas as pd
import torch

from cwlens.core.sinks import SinkGeometry, first_real_index
from cwlens.engine import adapter
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle

MEASURES = ("value", "output", "tail_mix")
BINS = torch.linspace(-1, 1, 41)


def layer_cosines(sg: SinkGeometry) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{measure: (cosines, valid mask)}``, each ``[batch, head, key or query]``."""
    k = sg.n_key
    keys = torch.arange(k, device=sg.sink_index.device)[None] > sg.sink_index[:, None]
    real_keys = keys[:, None, :] & (sg.geo.value_norm > 0)
    return {
        "value": (sg.value_cosine(), real_keys),
        "output": (sg.output_cosine(), sg.valid),
        "tail_mix": (sg.tail_cosine(), sg.valid),
    }


def _sink_geometries(cache, handle: ModelHandle, attention_mask, layers):
    resolved, _ = adapter.resolve_requested_layers(handle.n_layers, layers)
    if attention_mask is None:  # a padded batch's cache (cwlens.run_with_cache of texts)
        attention_mask = adapter.cache_mask(cache)
    for ly in resolved:
        geo = adapter.geometry(cache, handle, ly, attention_mask)
        mask = None if attention_mask is None else attention_mask.bool()
        sink = first_real_index(mask, geo.pattern.shape[0], geo.pattern.device)
        yield ly, SinkGeometry(geo, sink)


def alignment_statistics(cache, model, attention_mask=None, layers=None, sample_ids=None):
    """One row per ``(sample, layer, head)``: ``cos_{measure}_mean`` and ``cos_{measure}_neg``
    (fraction below 0) for each measure in :data:`MEASURES`."""
    return alignment_tables(cache, model, attention_mask, layers, sample_ids)[0]


@takes_model
def alignment_tables(cache, model: ModelLike, attention_mask=None, layers=None, sample_ids=None):
    """``(alignment_statistics, cosine_histograms)`` in one pass over the layers."""
    frames, hists = [], []
    for ly, sg in _sink_geometries(cache, model, attention_mask, layers):
        frame, hist = _layer_tables(sg, ly, sample_ids)
        frames.append(frame)
        hists.append(hist)
    return pd.concat(frames, ignore_index=True), pd.concat(hists, ignore_index=True)


def layer_tables(geo, layer: int, attention_mask=None, sample_ids=None):
    """``(alignment rows, histogram rows)`` of one layer's geometry (streaming-friendly;
    ``attention_mask`` None: the geometry's own ``position_mask``)."""
    if attention_mask is None:
        attention_mask = geo.position_mask
    mask = None if attention_mask is None else attention_mask.bool()
    sink = first_real_index(mask, geo.pattern.shape[0], geo.pattern.device)
    return _layer_tables(SinkGeometry(geo, sink), layer, sample_ids)


def _layer_tables(sg: SinkGeometry, ly: int, sample_ids):
    edges = BINS.numpy()
    b, h = sg.alpha0.shape[:2]
    ids = list(range(b)) if sample_ids is None else list(sample_ids)
    data = {
        "sample": [ids[i] for i in range(b) for _ in range(h)],
        "layer": ly,
        "head": [j for _ in range(b) for j in range(h)],
    }
    hists = []
    for name, (cos, valid) in layer_cosines(sg).items():
        hists.append(_histogram(ly, name, cos, valid, edges))
        w = valid.to(cos.dtype)
        n = w.sum(-1).clamp_min(1)
        data[f"cos_{name}_mean"] = ((cos * w).sum(-1) / n).flatten().cpu().numpy()
        data[f"cos_{name}_neg"] = (((cos < 0) * w).sum(-1) / n).flatten().cpu().numpy()
    return pd.DataFrame(data), pd.concat(hists, ignore_index=True)


def _histogram(layer, name, cos, valid, edges) -> pd.DataFrame:
    vals = cos[valid].float().cpu().clamp(-1, 1)
    counts = torch.histc(vals, bins=len(edges) - 1, min=-1, max=1)
    return pd.DataFrame(
        {"layer": layer, "measure": name, "bin_left": edges[:-1], "bin_right": edges[1:],
         "count": counts.numpy()}
    )


def cosine_histograms(cache, model, attention_mask=None, layers=None) -> pd.DataFrame:
    """Counts per ``(layer, measure, bin)`` over ``[-1, 1]`` in 40 bins (``bin_left``,
    ``bin_right``, ``count``); sum ``count`` over batches to combine them."""
    return alignment_tables(cache, model, attention_mask, layers)[1]


def histogram_summary(hist: pd.DataFrame) -> pd.DataFrame:
    """Per ``(layer, measure)``: n, mean (from bin centres), fraction negative, median."""
    rows = []
    for (layer, measure), g in hist.groupby(["layer", "measure"]):
        g = g.groupby(["bin_left", "bin_right"], as_index=False)["count"].sum()
        centres = (g["bin_left"] + g["bin_right"]) / 2
        n = g["count"].sum()
        cdf = g["count"].cumsum() / max(n, 1)
        median = float(centres[cdf >= 0.5].iloc[0]) if n else float("nan")
        rows.append(
            dict(layer=layer, measure=measure, n=int(n),
                 mean=float((centres * g["count"]).sum() / max(n, 1)),
                 frac_negative=float(g.loc[g["bin_right"] <= 0, "count"].sum() / max(n, 1)),
                 median=median)
        )
    return pd.DataFrame(rows)
