"""The masking condition of an lm-eval run, from ``--model_args``.

    --model_args pretrained=smollm2-135m,metric=contribution,mode=comprehensiveness,rate=0.3

``metric`` (default ``none``: the clean model) is a label-free ranking of
:mod:`cwlens.faithfulness.ranking` (the gradient ones need the item's label, which an
lm-eval request does not carry); ``mode`` is ``comprehensiveness`` (remove the top
``round(rate * n)`` entries of every scope unit) or ``sufficiency`` (the bottom ones);
``rate`` in [0, 1] (0: nothing removed, the clean model); ``scope`` (``row``/``head``/
``layer``), ``kind`` (``inter``/``intra``), ``layers`` (all by default; one layer, a list,
or ``"0;3"`` -- lm-eval splits model_args at commas), ``renormalize``,
``mask_first_token``, ``seed`` (the ``random`` control) and ``batch_tokens`` (padded
tokens per forward pass) are those of :class:`~cwlens.faithfulness.FaithfulnessConfig`,
with its defaults.
"""

from collections.abc import Callable
from typing import Any

from cwlens.core import metrics
from cwlens.errors import UnknownOptionError
from cwlens.faithfulness.config import LMEVAL_OPTIONS, FaithfulnessConfig

NO_MASK = ("none", "clean")
PLACEHOLDER = "attention"  # the clean model's config: any metric at rate 0 masks nothing


def parse_layers(value) -> tuple[int, ...] | None:
    """None, an int, a list/tuple of ints, or a string ``"0;3"`` / ``"0 3"`` / ``"2"``.
    A layer listed twice is refused, as on the command line."""
    if value is None or value == "" or value == "all":
        return None
    if isinstance(value, str):
        parts = value.replace(";", " ").replace("|", " ").split()
        try:
            layers = tuple(int(p) for p in parts)
        except ValueError:
            raise UnknownOptionError(
                f"layers={value!r}: give layer indices separated by ';' (e.g. layers=0;3), "
                "since lm-eval splits model_args at commas."
            ) from None
    else:
        items = value if isinstance(value, list | tuple) else [value]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            raise UnknownOptionError(
                f"layers must be layer indices (an int, a list of ints or a string like "
                f"'0;3'); got {value!r}.")
        layers = tuple(items)
    twice = sorted({ly for ly in layers if layers.count(ly) > 1})
    if twice:
        raise UnknownOptionError(f"layers={value!r}: layer {twice[0]} is listed twice.")
    return layers


TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


def read_bool(value, name: str) -> bool:
    """``True``/``False``, 1/0, or the strings true/false, yes/no, on/off, 1/0 (any case).
    Python's ``bool("no")`` is True, so anything else is refused."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE + FALSE:
        return value.strip().lower() in TRUE
    raise UnknownOptionError(f"{name}={value!r}: give true or false (or 1/0, yes/no).")


def read_int(value, name: str) -> int:
    """An int, or a string of one (``seed=1.5`` is refused, not cut to 1)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise UnknownOptionError(f"{name}={value!r}: give a whole number, e.g. {name}=2048"
                             if name == "batch_tokens" else
                             f"{name}={value!r}: give a whole number, e.g. {name}=0")


def read_rate(value) -> float:
    """A fraction in [0, 1] (checked by :class:`FaithfulnessConfig`); a string is parsed."""
    if isinstance(value, bool):
        raise UnknownOptionError(f"rate={value!r}: give a fraction in [0, 1], e.g. rate=0.3.")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise UnknownOptionError(
            f"rate={value!r}: give a fraction in [0, 1], e.g. rate=0.3 (not a percentage)."
        ) from None


# LMEVAL_OPTIONS' kinds
READERS: dict[str, Callable[[Any, str], Any]] = {
    "str": lambda v, _: str(v), "bool": read_bool, "int": read_int,
    "layers": lambda v, _: parse_layers(v)}


def masking_config(metric=None, mode: str = "comprehensiveness", rate: float | int = 0.0,
                   **options) -> FaithfulnessConfig:
    """A one-condition :class:`FaithfulnessConfig`. The clean model (metric ``none``) is
    rate 0, which the sweep runs as the clean pass alone (no mask, no masked pass).

    ``options``: the fields of :data:`~cwlens.faithfulness.config.LMEVAL_OPTIONS`
    (``scope``, ``kind``, ``layers``, ``renormalize``, ``mask_first_token``, ``seed``,
    ``batch_tokens``), with :class:`FaithfulnessConfig`'s defaults. Options are checked
    here (unknown option, metric, mode, scope or kind; rate outside [0, 1]), so a typo
    fails before the model is loaded.
    """
    unknown = sorted(set(options) - set(LMEVAL_OPTIONS))
    if unknown:
        raise UnknownOptionError(
            f"Unknown masking option {', '.join(map(repr, unknown))}: the options are metric, "
            f"mode, rate, {', '.join(LMEVAL_OPTIONS)}."
        )
    metric = "none" if metric is None else str(metric)
    clean = metric in NO_MASK
    if metric in metrics.GRADIENT:
        raise UnknownOptionError(
            f"metric={metric} is not available in cwlens-masked: it ranks by the gradient of "
            "the item's label margin (cwlens faithfulness), and lm-eval scores each choice as "
            "a request of its own, without the label. Use cwlens faithfulness --metrics "
            f"{metric} for it, or a label-free metric here.")
    # plain strings here; FaithfulnessConfig checks each against its valid values
    read: dict[str, Any] = {name: READERS[LMEVAL_OPTIONS[name]](value, name)
                            for name, value in options.items()}
    read.update(metrics=(PLACEHOLDER if clean else metric,), rates=(0.0 if clean else read_rate(rate),),
                modes=(str(mode),))
    return FaithfulnessConfig(**read)


def is_clean(cfg: FaithfulnessConfig) -> bool:
    """Nothing is masked: metric ``none`` or rate 0."""
    return cfg.rates[0] == 0.0


def describe(cfg: FaithfulnessConfig) -> dict:
    """The condition as lm-eval's results ``config`` records it (metric ``none`` where
    nothing is masked)."""
    if is_clean(cfg):
        return {"cwlens_metric": "none", "cwlens_rate": 0.0}
    out = {"cwlens_metric": cfg.metrics[0], "cwlens_mode": cfg.modes[0], "cwlens_rate": cfg.rates[0]}
    for name in LMEVAL_OPTIONS:
        if name != "batch_tokens":  # how the run is batched, not what it measures
            value = getattr(cfg, name)
            out[f"cwlens_{name}"] = ("all" if value is None else list(value)) if name == "layers" else value
    return out
