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

import difflib
from collections.abc import Callable
from typing import Any

import torch

from cwlens.core import metrics
from cwlens.errors import CwlensError, UnknownOptionError, UsageError
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
    """A fraction in [0, 1]; a string is parsed."""
    if isinstance(value, bool):
        raise UnknownOptionError(f"rate={value!r}: give a fraction in [0, 1], e.g. rate=0.3.")
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise UnknownOptionError(
            f"rate={value!r}: give a fraction in [0, 1], e.g. rate=0.3 (not a percentage)."
        ) from None
    if not 0.0 <= rate <= 1.0:  # (NaN too)
        raise UnknownOptionError(
            f"rate={value!r} is outside [0, 1]: rates are the fraction of entries removed, "
            "e.g. rate=0.3 (not a percentage).")
    return rate


class ModelArgsError(UsageError):
    """A ``--model_args`` entry of ``cwlens-masked`` that is unknown or has a value it does
    not take (the command line prints it as one ``error:`` line and exits 2)."""


def check_keys(given, known) -> None:
    """Refuse a ``model_args`` key that is not one of ``known``, suggesting the closest."""
    unknown = sorted(set(given) - set(known))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(known), n=1)
        raise ModelArgsError(
            f"cwlens-masked: unknown model_args {', '.join(map(repr, unknown))}"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + f". Known: {', '.join(known)}.")


def read_dtype(value) -> str | Any:
    """A floating torch dtype, or the name of one (``float32``, ``bfloat16``...)."""
    dtype = getattr(torch, value, None) if isinstance(value, str) else value
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ModelArgsError(
            f"dtype={value!r} is not a floating torch dtype: give float32 (the default), "
            "bfloat16, float16 or float64.")
    return dtype


def read_max_length(value) -> int | None:
    """None (the model's ``n_ctx``) or a whole number of tokens >= 2 (a context and one
    scored token)."""
    if value is None or value == "":
        return None
    try:
        n = read_int(value, "max_length")
    except UnknownOptionError:
        n = 0
    if n < 2:
        raise ModelArgsError(
            f"max_length={value!r}: give a whole number of tokens (2 or more), e.g. "
            "max_length=2048, or leave it out for the model's context length (n_ctx).")
    return n


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
    usable = [m for m in metrics.NAMES if m not in metrics.GRADIENT]
    if not clean and metric not in metrics.NAMES:
        close = difflib.get_close_matches(metric, usable, n=1)
        raise UnknownOptionError(
            f"Unknown metric={metric!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
            + f": give none (the clean model) or one of {', '.join(usable)}.")
    if metric in metrics.GRADIENT:
        raise UnknownOptionError(
            f"metric={metric} is not available in cwlens-masked: it ranks by the gradient of "
            "the item's label margin (cwlens faithfulness), and lm-eval scores each choice as "
            "a request of its own, without the label. Use cwlens faithfulness --metrics "
            f"{metric} for it, or a label-free metric here.")
    # plain strings here; FaithfulnessConfig checks each against its valid values
    read: dict[str, Any] = {name: READERS[LMEVAL_OPTIONS[name]](value, name)
                            for name, value in options.items()}
    given_rate = read_rate(rate)  # checked with or without a metric (rate=5 alone ran clean)
    read.update(metrics=(PLACEHOLDER if clean else metric,), rates=(0.0 if clean else given_rate,),
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


MASKING = ("metric", "mode", "rate", *LMEVAL_OPTIONS)  # model_args read by masking_config
LOADING = ("pretrained", "max_length", "device", "dtype", "progress")  # the model's own
IGNORED = ("batch_size", "max_batch_size")  # lm-eval's batching: batches hold batch_tokens


def read_model_args(args: dict) -> dict:
    """Every ``cwlens-masked`` model_arg checked before any model loads: ``{"config":
    FaithfulnessConfig, "dtype": torch.dtype, "max_length": int or None, "progress": bool}``
    (``pretrained`` and ``device`` are checked by :func:`cwlens.load_model`). Raises
    :class:`ModelArgsError` naming the entry and the fix. ``python -m cwlens.lmeval`` calls
    it on ``--model_args`` before lm-eval starts; the model calls it again."""
    args = {k: v for k, v in args.items() if k not in IGNORED}
    check_keys(args, (*LOADING, *MASKING))
    try:
        config = masking_config(**{k: v for k, v in args.items() if k in MASKING})
        progress = read_bool(args.get("progress", True), "progress")
    except CwlensError as err:
        raise ModelArgsError(f"cwlens-masked model_args: {err}") from err
    return {"config": config, "dtype": read_dtype(args.get("dtype", "float32")),
            "max_length": read_max_length(args.get("max_length")), "progress": progress}
