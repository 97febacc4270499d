"""The sink analysis' configuration, spelled once: :class:`SinkConfig`.

Its fields, defaults and checks are written here only; the resumable store's
configuration record (:meth:`SinkConfig.record`) is derived from it, and
:func:`cwlens.sinks.run.analyse` / :func:`~cwlens.sinks.run.run_to_folder` take its
fields as keywords.
"""

from dataclasses import asdict, dataclass, fields, replace

from cwlens.engine import validation
from cwlens.errors import InvalidArgumentError

EPS_GU = 0.3  # Gu et al.'s sink threshold: a sink head's mean sink rate exceeds it


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
    """

    max_tokens: int | None = 128
    batch_size: int = 8
    scales: tuple[float, ...] = (0.0, 0.5)
    eps: float = EPS_GU
    intervention: bool = True
    seed: int = 0
    swept_batches: int = 1

    def __post_init__(self):
        object.__setattr__(self, "scales", tuple(self.scales))
        validation.max_tokens(self.max_tokens)
        validation.positive_int(self.batch_size, "batch_size")

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
