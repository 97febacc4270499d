"""The sink analysis' configuration, spelled once: :class:`SinkConfig`.

Its fields, defaults and checks are written here only; the resumable store's
configuration record (:meth:`SinkConfig.record`) is derived from it, and
:func:`cwlens.sinks.run.analyse` / :func:`~cwlens.sinks.run.run_to_folder` take its
fields as keywords.
"""

import math
import numbers
from dataclasses import asdict, dataclass, fields, replace

from cwlens.engine import validation
from cwlens.errors import InvalidArgumentError
from cwlens.sinks.norm_intervention import check_scales

EPS_GU = 0.3  # Gu et al.'s sink threshold: a sink head's mean sink rate exceeds it


def check_eps(eps) -> None:
    """The sink-head threshold: a finite number in [0, 1] (not a bool)."""
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps) \
            or not 0 <= eps <= 1:
        raise InvalidArgumentError(f"eps is a threshold on a mean sink rate, in [0, 1]; got {eps!r}.")


@dataclass(frozen=True)
class SinkConfig:
    """Every choice of a sink run.

    Attributes:
        max_tokens: truncate each text to its first ``max_tokens`` tokens (default 128).
        batch_size: texts per forward pass (default 8).
        scales: sink-value scales of the intervention (default 0 and 0.5).
        eps: the sink-head threshold on the mean sink rate (Gu et al.: 0.3).
        intervention: run the sink-norm intervention (decoders only; default True).
        seed: seed of the intervention's random control position.
        swept_batches: batches whose sink-rate curve is also recomputed by sweeping (the
            check of the closed form; default 1).
        past_context: run texts past the model's context (``n_ctx``) up to
            ``max_tokens`` instead of cutting them at ``n_ctx`` (default False; rotary
            models only, see docs/inputs.md).
    """

    max_tokens: int | None = 128
    batch_size: int = 8
    scales: tuple[float, ...] = (0.0, 0.5)
    eps: float = EPS_GU
    intervention: bool = True
    seed: int = 0
    swept_batches: int = 1
    past_context: bool = False

    def __post_init__(self):
        check_scales(self.scales)
        object.__setattr__(self, "scales", tuple(self.scales))
        check_eps(self.eps)
        validation.flag(self.intervention, "intervention")  # "no" would be true
        validation.seed(self.seed)
        if isinstance(self.swept_batches, bool) or not isinstance(self.swept_batches, numbers.Integral) \
                or self.swept_batches < 0:
            raise InvalidArgumentError(
                f"swept_batches must be 0 or more (batches whose curve is also swept); got "
                f"{self.swept_batches!r}.")
        validation.max_tokens(self.max_tokens)
        if self.max_tokens is not None and self.max_tokens < 2:
            raise InvalidArgumentError(
                f"max_tokens={self.max_tokens} (CLI: --max-tokens) leaves the sink alone: the "
                "sink statistics compare it with the tail tokens after it, so pass 2 or more.")
        validation.positive_int(self.batch_size, "batch_size")
        validation.flag(self.past_context, "past_context")

    @classmethod
    def of(cls, config: "SinkConfig | None" = None, **settings) -> "SinkConfig":
        """``config`` (default: the defaults) with the fields in ``settings`` replaced."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(settings) - set(names))
        if unknown:
            raise InvalidArgumentError(
                f"Unknown sink setting {', '.join(map(repr, unknown))}: the settings are "
                f"{', '.join(names)}."
            )
        return replace(config or cls(), **settings)

    def record(self) -> dict:
        """The JSON-able record a resumable run keeps beside its batches."""
        out = asdict(self)
        out["scales"] = [float(x) for x in self.scales]
        return out
