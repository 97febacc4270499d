"""Sink-norm interventions: scale the sink's value vector and measure what breaks.

For each ``scale`` the value vector of the sink (``hook_v`` at the first real token of
each row; all kv heads of the chosen ``layers``, default all layers at once) is
multiplied by ``scale`` (0 removes ``a_i0 v~_0`` from every head output). The control
applies the same to one random non-sink position per row (uniform over the real tokens
after the sink, never a pad, whatever the padding side), drawn from ``(seed, sample id)``:
a text's control is the same whatever batch it is in (:func:`sample_uniform`).

Measured against the clean run:

- ``ppl_table``: per ``(sample, target, scale)`` the summed next-token NLL over real
  positions and the token count (``target`` is ``clean``, ``sink`` or ``random``);
  :func:`ppl_summary` turns it into PPL and ΔPPL = PPL(intervened) - PPL(clean).
- ``head_table``: per ``(sample, target, scale, layer)`` the mean head-output norm
  ``||o_i^h||`` before and after, and the *cone cosine* ``cos(o_i^h, mean_{sink<j<=i}
  v~_j^h)`` (the head output against the mean direction of the tail's projected values)
  before and after, over all ``(head, query)`` entries after the sink and over the
  *low-norm* ones: clean ``||o_i^h||`` below the :data:`LOW_NORM_QUANTILE` of that layer's
  clean head-output norms in the sample (its own heads and queries: not its batch's).
"""

import math
import zlib

import pandas as pd
import torch

from cwlens.core.sinks import (
    SinkGeometry,
    first_real_index,
    query_after_sink,
    random_non_sink_index,
)
from cwlens.engine import adapter, lm, validation
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle
from cwlens.engine.interventions.sinks import applied, sink_value_hooks
from cwlens.engine.streaming import stream_geometry
from cwlens.errors import InvalidArgumentError, NonFiniteError
from cwlens.runs.progress import tick

LOW_NORM_QUANTILE = 0.25  # heads below this quantile of their layer's clean output norm are low-norm


def sample_uniform(seed: int, sample_id) -> float:
    """The random control's draw for one sample: a uniform in [0, 1) seeded by ``(seed,
    sample id)`` alone, so its control position does not depend on the batch it is in."""
    g = torch.Generator().manual_seed(zlib.crc32(f"sink-control:{seed}:{sample_id}".encode()))
    return float(torch.rand(1, generator=g, dtype=torch.float64))


def nll_per_row(logits: "lm.LMOutput", tokens: torch.Tensor, attention_mask=None):
    """``(nll_sum [batch], n_tokens [batch])`` of next-token prediction on real positions
    (float32, :func:`cwlens.engine.lm.token_nll`; ``logits``: logits or, for long
    inputs, the final residual unembedded in chunks)."""
    nll, keep = lm.token_nll(logits, tokens, attention_mask)
    total = nll.sum(-1)
    bad = ~torch.isfinite(total)
    if bool(bad.any()):  # a NaN would read as PPL 1.0 once pandas sums the table
        raise NonFiniteError(
            f"The next-token NLL of row {int(bad.nonzero()[0])} is {float(total[bad][0])}: the "
            "logits hold NaN or inf (fp16 overflow, or a weight that is not finite: find it "
            "with torch.isfinite on model.parameters()). Run the model in float32.")
    return total, keep.sum(-1)


def layer_head_measures(geo, sink_index):
    """``(norm, cone, valid)`` of one layer's geometry, each ``[batch, head, query]``."""
    sg = SinkGeometry(geo, sink_index.to(geo.pattern.device))
    after = query_after_sink(sg.sink_index, sg.n_query, sg.n_key, geo.position_mask)[:, None, :]
    return geo.output_norm("intra"), sg.cone_cosine(), after.expand_as(sg.alpha0)


@takes_model
def sink_norm_intervention(
    model: ModelLike,
    tokens: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    scales=(0.0, 0.5),
    layers=None,
    control: bool = True,
    seed: int = 0,
    sample_ids=None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(ppl_table, head_table)`` for one batch (see the module docstring)."""
    adapter.require_next_token_model(
        model.info, "The sink-norm intervention",
        "Run the sink analysis with --no-intervention (intervention=False) on encoders.",
    )
    all_layers, _ = adapter.resolve_layers(model.n_layers, None)
    if layers is not None:
        adapter.resolve_requested_layers(model.n_layers, layers)  # [] would intervene nowhere
    _check_inputs(model, tokens, attention_mask, scales)
    mask = None if attention_mask is None else attention_mask.bool()
    b, n = tokens.shape
    ids = list(range(b)) if sample_ids is None else list(sample_ids)
    sink = first_real_index(mask, b, tokens.device)
    targets = {"sink": sink}
    if control:  # one draw per sample, from (seed, its id): the same in any batch
        draws = torch.tensor([sample_uniform(seed, sid) for sid in ids], dtype=torch.float64)
        targets["random"] = random_non_sink_index(sink, n, position_mask=mask, uniforms=draws)

    chunk = lm.chunk_for(n)  # long inputs: NLL in chunks, no [batch, n, vocab] logits

    def run(hooks):
        # streamed: each layer's measures are taken while the (intervened) model runs
        with torch.no_grad(), applied(model, hooks), lm.deferred_logits(model, chunk) as output:
            logits, measures = stream_geometry(
                model, tokens, lambda ly, geo: layer_head_measures(geo, sink), attention_mask=attention_mask)
        nll, cnt = nll_per_row(output(logits), tokens, attention_mask)
        tick()  # progress: one forward pass (cwlens.runs.progress)
        return nll.cpu(), cnt.cpu(), dict(zip(all_layers, measures, strict=True))

    nll0, cnt0, clean = run([])
    ppl_rows = [(ids[i], "clean", 1.0, float(nll0[i]), int(cnt0[i])) for i in range(b)]
    head_rows = []
    low = {}
    for ly, (norm, _, valid) in clean.items():  # each sample's own threshold, not its batch's
        thr = torch.stack([torch.quantile(norm[i][valid[i]].float(), LOW_NORM_QUANTILE)
                           if valid[i].any() else norm.new_zeros((), dtype=torch.float32)
                           for i in range(b)])
        low[ly] = valid & (norm < thr.to(norm.dtype)[:, None, None])
    for target, index in targets.items():
        for scale in scales:
            nll, cnt, after = run(sink_value_hooks(model, scale, index, layers))
            ppl_rows += [(ids[i], target, float(scale), float(nll[i]), int(cnt[i])) for i in range(b)]
            for ly in all_layers:
                head_rows += _head_rows(ids, target, scale, ly, clean[ly], after[ly], low[ly])
    ppl = pd.DataFrame(ppl_rows, columns=["sample", "target", "scale", "nll_sum", "n_tokens"])
    return ppl, pd.DataFrame(head_rows)


def _check_inputs(handle: ModelHandle, tokens, attention_mask, scales) -> None:
    """Token ids (a text has no batch to intervene on), finite scales, each once."""
    if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2:
        raise InvalidArgumentError(
            f"tokens must be a [batch, pos] tensor of token ids (model.to_tokens(texts), or "
            f"cwlens.engine.batching.pad_batch for several); got {type(tokens).__name__}.")
    validation.model_input(handle, tokens, attention_mask, "tokens")
    check_scales(scales)


def check_scales(scales) -> None:
    """A non-empty list of finite numbers, each once (a string would be split into
    characters, a bare number has no order)."""
    values = list(scales) if hasattr(scales, "__iter__") and not isinstance(scales, str) else None
    if not values or not all(isinstance(x, int | float) and not isinstance(x, bool)
                             and math.isfinite(x) for x in values):
        raise InvalidArgumentError(f"scales must be a non-empty list of finite numbers, e.g. "
                                   f"(0.0, 0.5); got {scales!r}.")
    twice = sorted({x for x in values if values.count(x) > 1})
    if twice:
        raise InvalidArgumentError(f"scales lists {twice} twice: each would be run twice; give "
                                   "each once.")


def _head_rows(ids, target, scale, layer, clean, after, low):
    norm0, cone0, valid = clean
    norm1, cone1, _ = after
    rows = []
    for i, sid in enumerate(ids):
        row = {"sample": sid, "target": target, "scale": float(scale), "layer": layer}
        for tag, sel in (("all", valid[i]), ("low", low[i])):
            k = sel.sum().clamp_min(1)
            row[f"n_{tag}"] = int(sel.sum())
            row[f"norm_before_{tag}"] = float((norm0[i] * sel).sum() / k)
            row[f"norm_after_{tag}"] = float((norm1[i] * sel).sum() / k)
            row[f"cone_before_{tag}"] = float((cone0[i] * sel).sum() / k)
            row[f"cone_after_{tag}"] = float((cone1[i] * sel).sum() / k)
        rows.append(row)
    return rows


def ppl_summary(ppl: pd.DataFrame) -> pd.DataFrame:
    """Per ``(target, scale)``: corpus PPL ``exp(sum nll / sum tokens)``, ΔPPL vs clean and
    the mean per-sample ΔPPL. A NaN in ``nll_sum`` stays NaN in every figure it enters
    (pandas' sum and mean would skip it: PPL 1.0, ΔPPL 0)."""
    per = ppl.assign(ppl=lambda d: (d.nll_sum / d.n_tokens.clip(lower=1)).map(_exp))
    clean = per[per.target == "clean"].set_index("sample")["ppl"]
    per["delta_ppl"] = per["ppl"] - per["sample"].map(clean)
    tot = ppl.groupby(["target", "scale"], as_index=False)[["nll_sum", "n_tokens"]].agg(_sum_keep_nan)
    tot["ppl"] = (tot.nll_sum / tot.n_tokens).map(_exp)
    base = float(tot.loc[tot.target == "clean", "ppl"].iloc[0])
    tot["delta_ppl"] = tot["ppl"] - base
    mean_delta = per.groupby(["target", "scale"], as_index=False)["delta_ppl"].agg(
        lambda col: col.mean(skipna=False))
    return tot.merge(mean_delta.rename(columns={"delta_ppl": "mean_sample_delta_ppl"}),
                     on=["target", "scale"])


def head_summary(heads: pd.DataFrame) -> pd.DataFrame:
    """Per ``(target, scale, layer)`` means over samples, plus ``norm_ratio_{all,low}``."""
    cols = [c for c in heads.columns if c not in ("sample", "target", "scale", "layer")]
    g = heads.groupby(["target", "scale", "layer"], as_index=False)[cols].mean()
    for tag in ("all", "low"):
        g[f"norm_ratio_{tag}"] = g[f"norm_after_{tag}"] / g[f"norm_before_{tag}"].clip(lower=1e-30)
        g[f"cone_change_{tag}"] = g[f"cone_after_{tag}"] - g[f"cone_before_{tag}"]
    return g


def _sum_keep_nan(col):
    """A column's sum that is NaN where a value is (pandas' own sum skips NaN)."""
    return col.sum(skipna=False)


def _exp(x: float) -> float:
    return math.exp(x)
