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
    (:mod:`cwlens.engine.gradients`): supervised (it reads the targets), not streamable.
    ``compute(scores, kind)`` maps the signed ``-a * dL/da`` scores of one layer.
``"random"``
    the seeded control of the faithfulness test (no scores from a model).

Pure Python (imported by :mod:`cwlens.core.geometry` and the CLI's help).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from cwlens.errors import UnknownOptionError

if TYPE_CHECKING:  # not imported at run time: the CLI reads this registry for its help
    import torch

Source = Literal["geometry", "gradient", "random"]


@dataclass(frozen=True)
class Look:
    """How a metric is shown (presentation only: no result depends on it).

    Attributes:
        label: legend label of figures.
        short: column label of tables (``attn``, ``contrib`` ...).
        color: line colour of figures.
    """

    label: str
    short: str
    color: str


@dataclass(frozen=True)
class Metric:
    """One per-entry metric: its math, and apart from it (:attr:`look`) how it is shown.

    Attributes:
        name: the name in APIs, result files and ``--metrics``.
        math: one line of math, for help texts and docs.
        look: :class:`Look` (label, short label, colour).
        source: ``"geometry"``, ``"gradient"`` or ``"random"`` (see the module doc).
        compute: ``(geometry or gradient scores, kind) -> [batch, head, query, key]``.
        uses_kind: whether ``kind`` (``o`` = the head's or the layer's output) changes it.
        supervised: reads target tokens (a reference, not a label-free attribution).
        hierarchy: one of the paper's four (attn < vw < vwon < contrib).
        default: part of the default faithfulness sweep (``--metrics all``).
    """

    name: str
    math: str
    look: Look
    source: Source = "geometry"
    compute: Callable[..., torch.Tensor] | None = None
    uses_kind: bool = False
    supervised: bool = False
    hierarchy: bool = False
    default: bool = False

    @property
    def label(self) -> str:
        return self.look.label

    @property
    def short(self) -> str:
        return self.look.short

    @property
    def color(self) -> str:
        return self.look.color


def _abs(t: torch.Tensor) -> torch.Tensor:
    return t.abs_()  # every compute returns a fresh tensor (gradient scores are cloned first)


def registry(*entries: Metric) -> dict[str, Metric]:
    """``{name: metric}``, refusing a name given twice."""
    out: dict[str, Metric] = {}
    for m in entries:
        if m.name in out:
            raise ValueError(f"metric {m.name!r} is registered twice")
        out[m.name] = m
    return out


REGISTRY: dict[str, Metric] = registry(
    Metric(name="attention", math="a_ij", look=Look("attention", "attn", "#1f77b4"),
           compute=lambda g, kind: g.attention(), hierarchy=True, default=True),
    Metric(name="value_weighted", math="a_ij ||v~_j||",
           look=Look("value-weighted", "vw", "#2ca02c"),
           compute=lambda g, kind: g.value_weighted(), hierarchy=True, default=True),
    Metric(name="value_weighted_output_normalized", math="a_ij ||v~_j|| / ||o_i||",
           look=Look("value-weighted output-norm.", "vwon", "#9467bd"),
           compute=lambda g, kind: g.value_weighted_output_normalized(kind), uses_kind=True,
           hierarchy=True, default=True),
    Metric(name="contribution", math="<o_i, a_ij v~_j> / ||o_i||^2",
           look=Look("contribution (signed)", "contrib", "#d62728"),
           compute=lambda g, kind: g.contribution(kind), uses_kind=True, hierarchy=True,
           default=True),
    Metric(name="contribution_abs", math="|c_ij|",
           look=Look("contribution |abs|", "abs contrib", "#ff7f0e"),
           compute=lambda g, kind: g.contribution_abs(kind), uses_kind=True, default=True),
    Metric(name="alti", math="max(0, ||y_i||_1 - ||y_i - a_ij v~_j||_1), y = resid_mid (LN'd in "
           "post-LN), residual one more part, normalised per query",
           look=Look("ALTI (Ferrando et al. 2022)", "alti", "#8c564b"),
           compute=lambda g, kind: g.alti()),
    Metric(name="alti_attention",
           math="max(0, ||o_i||_1 - ||o_i - a_ij v~_j||_1), normalised per row (no residual)",
           look=Look("L1 proximity to attn output", "alti(attn)", "#c49c94"),
           compute=lambda g, kind: g.alti_attention(kind), uses_kind=True),
    Metric(name="attention_gradient", math="-a_ij dL/da_ij (first-order loss increase on removal)",
           look=Look("attention × gradient (supervised)", "attn×grad (sup.)", "#17becf"),
           source="gradient", compute=lambda s, kind: s, supervised=True),
    Metric(name="attention_gradient_abs", math="|a_ij dL/da_ij|",
           look=Look("|attention × gradient| (supervised)", "|attn×grad| (sup.)", "#bcbd22"),
           source="gradient", compute=lambda s, kind: _abs(s.clone()), supervised=True),
    Metric(name="random", math="seeded uniform scores (control)",
           look=Look("random", "random", "#7f7f7f"), source="random", default=True),
)

# The options of the measures and the masking protocol, listed here only (cwlens.core._types
# re-exports the types): the output o a value-aware metric projects on (the head's own or
# the layer's), what a mask removes (the top- or the bottom-ranked entries) and the unit
# a rate applies in.
Kind = Literal["intra", "inter"]
Mode = Literal["comprehensiveness", "sufficiency"]
Scope = Literal["row", "head", "layer"]
KINDS: tuple[Kind, ...] = get_args(Kind)
MODES: tuple[Mode, ...] = get_args(Mode)
SCOPES: tuple[Scope, ...] = get_args(Scope)

NAMES: tuple[str, ...] = ()
HIERARCHY: tuple[str, ...] = ()  # the paper's four, least to most faithful (its claimed order)
GEOMETRY: tuple[str, ...] = ()  # computable from one layer's geometry (the streaming engine's)
GRADIENT: tuple[str, ...] = ()
DEFAULT: tuple[str, ...] = ()  # the default sweep: the paper's label-free metrics, the control


def _derive() -> None:
    """(Re)derive the lists above from :data:`REGISTRY` (read them as ``metrics.NAMES``
    at call time: they follow :func:`registered`)."""
    global NAMES, HIERARCHY, GEOMETRY, GRADIENT, DEFAULT
    NAMES = tuple(REGISTRY)
    HIERARCHY = tuple(n for n, m in REGISTRY.items() if m.hierarchy)
    GEOMETRY = tuple(n for n, m in REGISTRY.items() if m.source == "geometry")
    GRADIENT = tuple(n for n, m in REGISTRY.items() if m.source == "gradient")
    DEFAULT = tuple(n for n, m in REGISTRY.items() if m.default)


_derive()


@contextmanager
def registered(*entries: Metric) -> Iterator[None]:
    """Add ``entries`` to :data:`REGISTRY` for the block (a metric of your own: the
    measures, the stream, the rankings and the faithfulness harness then know it)."""
    taken = [m.name for m in entries if m.name in REGISTRY]
    if taken:
        raise UnknownOptionError(f"metric {taken[0]!r} is registered already: pick another name.")
    REGISTRY.update(registry(*entries))
    _derive()
    try:
        yield
    finally:
        for m in entries:
            REGISTRY.pop(m.name, None)
        _derive()


def legend(names) -> str:
    """One line that spells out the table labels of ``names`` (in registry order), e.g.
    ``Legend: attn = attention (`a_ij`); vw = value-weighted (`a_ij ||v~_j||`); ...``: printed
    under every table that uses the short labels."""
    parts = []
    for name, m in REGISTRY.items():
        if name in set(names):
            note = ""
            if name == "value_weighted_output_normalized":
                note = (": ||o_i|| is one constant per row, so at row scope it ranks, masks and "
                        "scores exactly as vw")
            parts.append(f"{m.short} = {m.label} (`{m.math}`{note})")
    return "Legend: " + "; ".join(parts) + "." if parts else ""


def get(name: str, allowed: tuple[str, ...] | None = None) -> Metric:
    """The :class:`Metric` called ``name`` (one of ``allowed``, default: every name), or an
    error listing the valid names."""
    allowed = NAMES if allowed is None else allowed
    if name not in allowed:
        hint = ""
        if name in GRADIENT:
            hint = (" Gradient metrics need a backward pass with the loss on the targets: "
                    "use cwlens.engine.gradients.attention_gradient or the faithfulness harness.")
        elif name == "random":
            hint = " 'random' is the faithfulness test's control, not a measure."
        raise UnknownOptionError(
            f"Unknown metric={name!r}. Valid metrics: {', '.join(repr(m) for m in allowed)}.{hint}"
        )
    return REGISTRY[name]


def from_geometry(geometry, name: str, kind: str = "inter") -> torch.Tensor:
    """``[batch, head, query, key]`` scores of a geometry metric (see :data:`GEOMETRY`)."""
    compute = get(name, GEOMETRY).compute
    if compute is None:
        raise UnknownOptionError(
            f"metric {name!r} is registered without a compute function, so it cannot be "
            "read from a geometry: register it with compute=... (cwlens.core.metrics)."
        )
    return compute(geometry, kind)


def help_text() -> str:
    """One line per metric, for CLI help and errors."""
    lines = []
    for m in REGISTRY.values():
        tags = [t for t, on in (("supervised", m.supervised), ("not default", not m.default)) if on]
        lines.append(f"  {m.name:<34} {m.math}" + (f"  [{', '.join(tags)}]" if tags else ""))
    return "\n".join(lines)
