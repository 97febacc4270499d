"""The faithfulness sweep's configuration: every choice of the protocol, spelled once.

:class:`FaithfulnessConfig` is the one place its fields, defaults and checks are written;
the CLI flags, the lm-eval model arguments and the provenance columns of every row are
derived from it. :class:`Condition` is one (metric, mode, rate, layer set) of a sweep.
"""

from dataclasses import dataclass, field, fields

from cwlens.core import metrics
from cwlens.core._types import Kind, Mode, Scope
from cwlens.core.geometry import check_kind
from cwlens.engine import validation
from cwlens.errors import InvalidArgumentError, LayerOutOfRangeError
from cwlens.faithfulness.ranking import MODES, RANKINGS, SCOPES, check_option

RANKING_PATHS = ("auto", "whole_layer", "lockstep")  # cwlens.faithfulness.lockstep.use_lockstep


def _field(default, *, provenance: bool = False, lmeval: str | None = None):
    return field(default=default, metadata={"provenance": provenance, "lmeval": lmeval})


@dataclass(frozen=True)
class FaithfulnessConfig:
    """Every choice of the protocol, with its default (see ``docs/faithfulness.md``).

    Attributes:
        metrics: rankings compared (default: all of :data:`~cwlens.faithfulness.ranking.RANKINGS`).
        rates: fractions of eligible entries removed per scope unit (default 0.1, 0.3, 0.5).
        modes: ``comprehensiveness`` (remove top-ranked) and/or ``sufficiency`` (bottom).
        scope: ``"row"`` (per head and query, default), ``"head"`` or ``"layer"``.
        layers: layers masked; None = all (default).
        per_layer: False (default): the layers are masked all at once; True: one at a
            time (one condition per layer, ``n_layers`` times the cost).
        kind: ``"inter"`` (default) or ``"intra"``: the output the value-aware metrics
            project on.
        causal_only: only keys ``j <= i`` are eligible (default True).
        mask_first_token: the first token (BOS / sink) is eligible (default True).
        renormalize: give the removed attention mass back to the other keys (default
            False: the masked terms are just removed).
        seed: seed of the ``random`` control.
        max_tokens: truncate language-modelling documents to their first ``max_tokens``
            tokens (default 512; None: whole documents -- above 2048 tokens the passes run
            blockwise and, at row scope, the masks are ranked per query block: see
            ``ranking_path``).
        past_context: run documents past the model's context (``n_ctx``) up to
            ``max_tokens`` instead of cutting them at ``n_ctx`` (default False; rotary
            models only, see docs/inputs.md). Long documents are scored without
            ``[pos, vocab]`` logits (:mod:`cwlens.engine.lm`).
        prepend_bos: every text and multiple-choice input starts with the model's BOS
            token, as TransformerLens tokenizes by default (default True); False for a
            model trained without one (CLI ``--no-bos``). Recorded in the results'
            configuration only when False.
        batch_tokens: padded tokens per forward pass (default 2048).
        reuse: share forward passes between conditions with identical masks (default True).
        ranking_path: how row-scope masks are made (the results are the same):
            ``"whole_layer"`` ranks each layer's ``[batch, head, n, n]`` in the clean pass
            and keeps the masks bit-packed; ``"lockstep"`` runs the clean and the masked
            copies as one batch and ranks each query block as it is computed
            (:mod:`cwlens.faithfulness.lockstep`; row scope, no gradient metrics);
            ``"auto"`` (default): lockstep where attention runs blockwise (above 2048
            tokens) at row scope without gradient metrics, else whole-layer.
    """

    metrics: tuple[str, ...] = RANKINGS
    rates: tuple[float, ...] = (0.1, 0.3, 0.5)
    modes: tuple[Mode, ...] = MODES
    # the fields below marked provenance=True are columns of every results row, in this
    # order (cwlens.faithfulness.results.SETTING); lmeval names how an lm-eval model_args
    # value is read (cwlens.lmeval.settings)
    scope: Scope = _field("row", provenance=True, lmeval="str")
    kind: Kind = _field("inter", provenance=True, lmeval="str")
    renormalize: bool = _field(False, provenance=True, lmeval="bool")
    causal_only: bool = _field(True, provenance=True)
    mask_first_token: bool = _field(True, provenance=True, lmeval="bool")
    max_tokens: int | None = _field(512, provenance=True)
    past_context: bool = False
    prepend_bos: bool = True
    seed: int = _field(0, provenance=True, lmeval="int")
    layers: tuple[int, ...] | None = _field(None, lmeval="layers")
    per_layer: bool = False
    batch_tokens: int = _field(2048, lmeval="int")
    reuse: bool = True
    ranking_path: str = "auto"

    def __post_init__(self):
        for name, example in (("metrics", "('contribution',)"), ("rates", "(0.1, 0.5)"),
                              ("modes", "('comprehensiveness',)")):
            value = getattr(self, name)
            if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
                raise InvalidArgumentError(  # a bare string would be split into letters
                    f"{name} must be a list or tuple, e.g. {name}={example}; got {value!r}.")
        for name in ("renormalize", "causal_only", "mask_first_token", "per_layer", "reuse",
                     "prepend_bos"):
            validation.flag(getattr(self, name), name)  # "no" would be true
        validation.seed(self.seed)
        if self.layers is not None and (isinstance(self.layers, str | bytes)
                                        or not hasattr(self.layers, "__iter__")):
            raise InvalidArgumentError(
                f"layers must be a list or tuple of layer indices (or None for all), e.g. "
                f"layers=(0,); got {self.layers!r}.")
        # repeated entries would repeat conditions and count every sample twice
        for name in ("metrics", "rates", "modes", "layers"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(dict.fromkeys(value)))
        for m in self.metrics:
            check_option(m, metrics.NAMES, "metric")
        for mode in self.modes:
            check_option(mode, MODES, "mode")
        check_option(self.scope, SCOPES, "scope")
        check_kind(self.kind)
        for name in ("metrics", "rates", "modes"):
            if not getattr(self, name):
                raise InvalidArgumentError(f"{name} is empty: give at least one.")
        for r in self.rates:
            validation.rate(r, "rates")
        validation.positive_int(self.batch_tokens, "batch_tokens")
        validation.max_tokens(self.max_tokens)
        validation.flag(self.past_context, "past_context")
        check_option(self.ranking_path, RANKING_PATHS, "ranking_path")
        if self.layers is not None:
            for ly in self.layers:
                if isinstance(ly, bool) or not isinstance(ly, int) or ly < 0:
                    raise LayerOutOfRangeError(
                        f"layers must be non-negative ints (or None for all); got {ly!r}."
                    )

    def provenance(self) -> dict:
        """The columns every results row carries of this configuration
        (:data:`PROVENANCE`)."""
        return {name: getattr(self, name) for name in PROVENANCE}

    def layer_sets(self, n_layers: int) -> list[tuple[str, tuple[int, ...]]]:
        """``[(label, layers)]``: one set (``"all"`` or ``"0,3"``) or one per layer."""
        layers = tuple(range(n_layers)) if self.layers is None else tuple(self.layers)
        if self.per_layer:
            return [(str(ly), (ly,)) for ly in layers]
        label = "all" if self.layers is None else ",".join(map(str, layers))
        return [(label, layers)]

    def conditions(self, n_layers: int) -> list["Condition"]:
        return [
            Condition(metric, mode, float(rate), label, layers)
            for label, layers in self.layer_sets(n_layers)
            for metric in self.metrics
            for mode in self.modes
            for rate in self.rates
        ]


@dataclass(frozen=True)
class Condition:
    metric: str  # a name of cwlens.core.metrics.REGISTRY
    mode: Mode
    rate: float
    layers_label: str
    layers: tuple[int, ...]


# what every results row records of its configuration (after model and dataset)
PROVENANCE: tuple[str, ...] = tuple(f.name for f in fields(FaithfulnessConfig) if f.metadata.get("provenance"))
# the fields an lm-eval run sets in model_args (beside metric, mode and rate), and how
# each value is read: "str", "bool", "int" or "layers"
LMEVAL_OPTIONS: dict[str, str] = {f.name: f.metadata["lmeval"] for f in fields(FaithfulnessConfig)
                                  if f.metadata.get("lmeval")}
