"""Why the movement truth (b) agrees with every value-aware measure by construction, as
numbers: :func:`separation` measures, on a compiled program's inputs, how far value-weighted
attention ``a_ij ||v~_j||`` separates the movement set from every other entry.

tracr compiles a selector to attention of about ``1 / |selected|`` on the selected keys
(a softmax of scores ``beta`` against ``0``, with ``beta`` large) and a value to a one-hot
(categorical) or 0/1 (numerical) vector; tracr cannot compile values that cancel
("Attention patterns can currently only average binary variables"). So ``a_ij ||v~_j||``
is about ``||v|| / |selected|`` on a moved entry and only the softmax's leak elsewhere: the
movement set is where it is non-zero. ``python scripts/movement_by_construction.py``
prints the table docs/groundtruth.md cites.
"""

from dataclasses import dataclass
from typing import Any

import torch

import cwlens
from cwlens.core import metrics
from cwlens.engine import adapter
from cwlens.engine.handle import wrap
from cwlens.groundtruth.codec import encode
from cwlens.groundtruth.evaluate import float64_copy
from cwlens.groundtruth.padding import padding_heads
from cwlens.groundtruth.scoring import RESOLUTION


@dataclass(frozen=True)
class Separation:
    """One program's numbers over its inputs.

    Attributes:
        program: the name.
        n_inputs: the inputs measured.
        separated: inputs where every moved entry's ``a ||v~||`` exceeds every other
            entry's (the value-weighted AUROC against (b) is then 1, fall-back rows included).
        exact_support: inputs where the entries with ``a ||v~||`` above 1e-4 of the
            layer's largest ``||v~||`` over all the inputs measured ("non-zero" up to the
            softmax's leak) are exactly the movement set.
        worst_ratio: the largest, over inputs, of (largest ``a ||v~||`` outside the movement
            set) / (smallest inside it): the leak against what moves.
        attention_error: the largest ``|a_ij - 1/|selected_i||`` over the selected keys of
            the Aggregate heads' rows that did not fall back (NaN: no Aggregate head).
    """

    program: str
    n_inputs: int
    separated: int
    exact_support: int
    worst_ratio: float
    attention_error: float


def separation(program: Any, n_inputs: int = 256, seed: int = 0) -> Separation:
    """:class:`Separation` of ``program`` (a ``CompiledProgram``) on ``sample_inputs(n_inputs,
    seed)``; entries: every head but tracr's padding heads, queries ``>= 1``, every key."""
    model = float64_copy(program.model)
    handle = wrap(model)
    n_layers = len(model.blocks)
    real = ~padding_heads(model)
    aggregate = torch.zeros_like(real)
    for p in program.placements:
        if p.head is not None and p.kind == "aggregate":
            aggregate[p.layer, p.head] = True
    inputs = program.sample_inputs(n_inputs, seed)
    measured = []
    for row in inputs:
        _, cache = cwlens.run_with_cache(handle, encode(model, row))
        geos = [adapter.geometry(cache, handle, ly) for ly in range(n_layers)]
        measured.append((torch.stack([metrics.from_geometry(g, "value_weighted", "inter")[0].double()
                                      for g in geos]),  # [layer, head, q, k]
                         torch.stack([g.attention()[0].double() for g in geos]),
                         torch.stack([g.value_norm[0].double().amax() for g in geos])))  # [layer]
    scale = torch.stack([m[2] for m in measured]).amax(0)  # each layer's largest ||v~||
    separated = exact = 0
    worst, attention_error = 0.0, float("nan") if not aggregate.any() else 0.0
    for (vw, att, _), truth in zip(measured, program.truth(inputs), strict=True):
        keep = real[:, :, None, None].expand_as(vw).clone()
        keep[:, :, 0] = False
        moved = truth.movement.to(torch.bool) & keep
        inside, outside = vw[moved], vw[keep & ~moved]
        if inside.numel():
            largest_out = float(outside.max()) if outside.numel() else 0.0
            separated += largest_out < float(inside.min())
            worst = max(worst, largest_out / float(inside.min()))
        else:
            separated += 1
        exact += bool(torch.equal((vw > RESOLUTION * scale[:, None, None, None]) & keep, moved))
        rows = aggregate[:, :, None] & ~truth.fallback.to(torch.bool)
        rows[:, :, 0] = False
        selected = truth.selected.to(torch.bool) & rows[..., None]
        if selected.any():
            width = truth.selected.to(torch.bool).sum(-1, keepdim=True).expand_as(selected)
            attention_error = max(attention_error,
                                  float((att[selected] - 1.0 / width[selected]).abs().max()))
    return Separation(program.name, len(inputs), separated, exact, worst, attention_error)
