"""The masking condition of an lm-eval run, from ``--model_args``.

    --model_args pretrained=smollm2-135m,metric=contribution,mode=comprehensiveness,rate=0.3

``metric`` (default ``none``: the clean model) is a ranking of
:mod:`cwlens.faithfulness.ranking`; ``mode`` is ``comprehensiveness`` (remove the top
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

from cwlens.errors import UnknownOptionError
from cwlens.faithfulness.config import LMEVAL_OPTIONS, FaithfulnessConfig

NO_MASK = ("none", "clean")
PLACEHOLDER = "attention"  # the clean model's config: any metric at rate 0 masks nothing


def parse_layers(value) -> tuple[int, ...] | None:
    """None, an int, a list/tuple of ints, or a string ``"0;3"`` / ``"0 3"`` / ``"2"``."""
    if value is None or value == "" or value == "all":
        return None
    if isinstance(value, bool):
        raise UnknownOptionError(f"layers must be layer indices; got {value!r}.")
    if isinstance(value, int):
        return (value,)
    if isinstance(value, str):
        parts = value.replace(";", " ").replace("|", " ").split()
        try:
            return tuple(int(p) for p in parts)
        except ValueError:
            raise UnknownOptionError(
                f"layers={value!r}: give layer indices separated by ';' (e.g. layers=0;3), "
                "since lm-eval splits model_args at commas."
            ) from None
    return tuple(int(v) for v in value)


READERS: dict[str, Callable[[Any], Any]] = {"str": str, "bool": bool, "int": int, "layers": parse_layers}  # LMEVAL_OPTIONS' kinds


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
    # plain strings here; FaithfulnessConfig checks each against its valid values
    read: dict[str, Any] = {name: READERS[LMEVAL_OPTIONS[name]](value) for name, value in options.items()}
    read.update(metrics=(PLACEHOLDER if clean else metric,), rates=(0.0 if clean else float(rate),),
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
