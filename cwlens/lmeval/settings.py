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

from typing import Any

from cwlens.errors import UnknownOptionError
from cwlens.faithfulness.sweep import FaithfulnessConfig

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


def masking_config(
    metric=None,
    mode: str = "comprehensiveness",
    rate: float | int = 0.0,
    scope: str = "row",
    kind: str = "inter",
    layers=None,
    renormalize: bool = False,
    mask_first_token: bool = True,
    seed: int = 0,
    batch_tokens: int = 2048,
) -> FaithfulnessConfig:
    """A one-condition :class:`FaithfulnessConfig`. The clean model (metric ``none``) is
    rate 0, which the sweep runs as the clean pass alone (no mask, no masked pass).

    Options are checked here (unknown metric, mode, scope or kind; rate outside [0, 1]),
    so a typo fails before the model is loaded.
    """
    metric = "none" if metric is None else str(metric)
    clean = metric in NO_MASK
    # plain strings here; FaithfulnessConfig checks each against its valid values
    options: dict[str, Any] = {
        "metrics": (PLACEHOLDER if clean else metric,),
        "rates": (0.0 if clean else float(rate),),
        "modes": (str(mode),),
        "scope": str(scope),
        "layers": parse_layers(layers),
        "kind": str(kind),
        "renormalize": bool(renormalize),
        "mask_first_token": bool(mask_first_token),
        "seed": int(seed),
        "batch_tokens": int(batch_tokens),
    }
    return FaithfulnessConfig(**options)


def is_clean(cfg: FaithfulnessConfig) -> bool:
    """Nothing is masked: metric ``none`` or rate 0."""
    return cfg.rates[0] == 0.0


def describe(cfg: FaithfulnessConfig) -> dict:
    """The condition as lm-eval's results ``config`` records it (metric ``none`` where
    nothing is masked)."""
    if is_clean(cfg):
        return {"cwlens_metric": "none", "cwlens_rate": 0.0}
    return {
        "cwlens_metric": cfg.metrics[0],
        "cwlens_mode": cfg.modes[0],
        "cwlens_rate": cfg.rates[0],
        "cwlens_scope": cfg.scope,
        "cwlens_kind": cfg.kind,
        "cwlens_layers": "all" if cfg.layers is None else list(cfg.layers),
        "cwlens_renormalize": cfg.renormalize,
        "cwlens_mask_first_token": cfg.mask_first_token,
        "cwlens_seed": cfg.seed,
    }
