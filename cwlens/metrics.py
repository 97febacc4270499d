"""The registry of per-entry importance metrics: one entry per metric, read everywhere.

An *entry* is ``(layer, head h, query i, key j)``: the term ``a_ij^h v~_j^h`` of head
``h``'s output at query ``i``. A metric gives every entry a score (higher = more
important). Everything that lists metrics -- the measures, the streaming engine, the
faithfulness rankings, the report tables, the figure colours and the CLI help -- reads
:data:`REGISTRY`, so adding a metric is one :class:`Metric` here (plus its math).

Three sources of scores:

``"geometry"``
    computed from one layer's :class:`~cwlens.core.AttentionGeometry` (the pattern, the
    values and W_O): label-free, streamable (:func:`cwlens.stream`), ``compute(geometry,
    kind)``.
``"gradient"``
    needs a forward *and* a backward pass with the loss on the sample's own tokens
    (:mod:`cwlens.gradients`): supervised (it reads the targets), not streamable.
    ``compute(scores, kind)`` maps the signed ``-a * dL/da`` scores of one layer.
``"random"``
    the seeded control of the faithfulness test (no scores from a model).

Pure Python (imported by :mod:`cwlens.core.geometry` and the CLI's help).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from cwlens.errors import UnknownOptionError

if TYPE_CHECKING:  # not imported at run time: the CLI reads this registry for its help
    import torch

Source = Literal["geometry", "gradient", "random"]


@dataclass(frozen=True)
class Metric:
    """One per-entry metric.

    Attributes:
        name: the name in APIs, result files and ``--metrics``.
        label: legend label of figures.
        short: column label of tables (``attn``, ``contrib`` ...).
        color: line colour of figures.
        uses_kind: whether ``kind`` (``o`` = the head's or the layer's output) changes it.
        supervised: reads target tokens (a reference, not a label-free attribution).
        source: ``"geometry"``, ``"gradient"`` or ``"random"`` (see the module doc).
        compute: ``(geometry or gradient scores, kind) -> [batch, head, query, key]``.
        hierarchy: one of the paper's four (attn < vw < vwon < contrib).
        default: part of the default faithfulness sweep (``--metrics all``).
        math: one line of math, for help texts and docs.
    """

    name: str
    label: str
    short: str
    color: str
    uses_kind: bool
    supervised: bool
    source: Source
    compute: Callable[..., torch.Tensor] | None
    hierarchy: bool
    default: bool
    math: str


def _abs(t: torch.Tensor) -> torch.Tensor:
    return t.abs_()  # every compute returns a fresh tensor (gradient scores are cloned first)


REGISTRY: dict[str, Metric] = {m.name: m for m in (
    Metric("attention", "attention", "attn", "#1f77b4", False, False, "geometry",
           lambda g, kind: g.attention(), True, True, "a_ij"),
    Metric("value_weighted", "value-weighted", "vw", "#2ca02c", False, False, "geometry",
           lambda g, kind: g.value_weighted(), True, True, "a_ij ||v~_j||"),
    Metric("value_weighted_output_normalized", "value-weighted output-norm.", "vwon", "#9467bd",
           True, False, "geometry", lambda g, kind: g.value_weighted_output_normalized(kind),
           True, True, "a_ij ||v~_j|| / ||o_i||"),
    Metric("contribution", "contribution (signed)", "contrib", "#d62728", True, False, "geometry",
           lambda g, kind: g.contribution(kind), True, True, "<o_i, a_ij v~_j> / ||o_i||^2"),
    Metric("contribution_abs", "contribution |abs|", "abs contrib", "#ff7f0e", True, False,
           "geometry", lambda g, kind: _abs(g.contribution(kind)), False, True, "|c_ij|"),
    Metric("alti", "ALTI (Ferrando et al. 2022)", "alti", "#8c564b", False, False, "geometry",
           lambda g, kind: g.alti(), False, False,
           "max(0, ||y_i||_1 - ||y_i - a_ij v~_j||_1), y = resid_mid (LN'd in post-LN), "
           "residual one more part, normalised per query"),
    Metric("alti_attention", "L1 proximity to attn output", "alti(attn)", "#c49c94", True, False,
           "geometry", lambda g, kind: g.alti_attention(kind), False, False,
           "max(0, ||o_i||_1 - ||o_i - a_ij v~_j||_1), normalised per row (no residual)"),
    Metric("attention_gradient", "attention × gradient (supervised)", "attn×grad (sup.)",
           "#17becf", False, True, "gradient", lambda s, kind: s, False, False,
           "-a_ij dL/da_ij (first-order loss increase on removal)"),
    Metric("attention_gradient_abs", "|attention × gradient| (supervised)", "|attn×grad| (sup.)",
           "#bcbd22", False, True, "gradient", lambda s, kind: _abs(s.clone()), False, False,
           "|a_ij dL/da_ij|"),
    Metric("random", "random", "random", "#7f7f7f", False, False, "random", None, False, True,
           "seeded uniform scores (control)"),
)}

NAMES: tuple[str, ...] = tuple(REGISTRY)
# the paper's four, in the order of its claimed hierarchy (least to most faithful)
HIERARCHY: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.hierarchy)
# every metric computable from one layer's geometry (the streaming engine's)
GEOMETRY: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.source == "geometry")
GRADIENT: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.source == "gradient")
# the default faithfulness sweep: the label-free metrics of the paper and the control
DEFAULT: tuple[str, ...] = tuple(n for n, m in REGISTRY.items() if m.default)


def get(name: str, allowed: tuple[str, ...] = NAMES) -> Metric:
    """The :class:`Metric` called ``name``, or an error listing the valid names."""
    if name not in allowed:
        hint = ""
        if name in GRADIENT:
            hint = (" Gradient metrics need a backward pass with the loss on the targets: "
                    "use cwlens.gradients.attention_gradient or the faithfulness harness.")
        elif name == "random":
            hint = " 'random' is the faithfulness test's control, not a measure."
        raise UnknownOptionError(
            f"Unknown metric={name!r}. Valid metrics: {', '.join(repr(m) for m in allowed)}.{hint}"
        )
    return REGISTRY[name]


def from_geometry(geometry, name: str, kind: str = "inter") -> torch.Tensor:
    """``[batch, head, query, key]`` scores of a geometry metric (see :data:`GEOMETRY`)."""
    compute = get(name, GEOMETRY).compute
    assert compute is not None  # every geometry metric has one
    return compute(geometry, kind)


def help_text() -> str:
    """One line per metric, for CLI help and errors."""
    lines = []
    for m in REGISTRY.values():
        tags = [t for t, on in (("supervised", m.supervised), ("not default", not m.default)) if on]
        lines.append(f"  {m.name:<34} {m.math}" + (f"  [{', '.join(tags)}]" if tags else ""))
    return "\n".join(lines)
