"""What ``cwlens replicate`` runs: the models, the sample sizes and the folder layout."""

from dataclasses import dataclass, field
from pathlib import Path

from cwlens.core import metrics

DEFAULT_MODELS = ("smollm2-135m", "gemma-3-270m", "all-minilm-l6-v2")
# ERASER's bins read both ways (removed 0.01..0.5; sufficiency also kept 0.01..0.5 =
# removed 0.5..0.99, cwlens.faithfulness.aopc.bins) and 0.3 for the curve's middle
RATES = (0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 0.9, 0.95, 0.99)
PER_LAYER_METRICS = ("attention", "contribution", "alti", "random")
# the second view (first token never masked): the paper's four, |c|, the peers' ALTI and the
# random control -- not the gradient metrics (a forward + backward per batch) or alti_attention
FIRST_TOKEN_METRICS = ("attention", "value_weighted", "value_weighted_output_normalized",
                       "contribution", "contribution_abs", "alti", "random")


@dataclass(frozen=True)
class ReplicationConfig:
    """Every choice of ``cwlens replicate`` (defaults sized for a 2-core CPU; on 2 shared
    cores SmolLM2-135M alone takes about 1.5 h, Gemma-3-270M about twice that).

    Attributes:
        samples: FineWeb-Edu documents per decoder faithfulness run (first
            ``max_tokens`` tokens each).
        max_tokens: tokens per document (faithfulness, sinks).
        rates: removal rates of the perturbation curves (AOPC averages over them).
        sentences: FineWeb-Edu sentences of the encoder task and the token-class analysis.
        sink_samples: GSM8K texts of the sink analysis.
        per_layer_model: the model masked one layer at a time ("" for none).
        per_layer_samples, per_layer_rate: that run's size (``PER_LAYER_METRICS``).
        batch_tokens: padded tokens per forward pass (decoder faithfulness; lowered for
            large vocabularies, see :func:`cwlens.replication.stages.batch_tokens`).
        seed: seed of the random control.
        first_token_view: also run the faithfulness test with the first token never
            masked (``mask_first_token=False``: the BOS sink / [CLS] keeps its term in
            every row, as ferret drops [CLS]/[SEP]), into :data:`FIRST_TOKEN_KEPT`.
        first_token_metrics: the metrics of that view (:data:`FIRST_TOKEN_METRICS`; a
            model's own filters apply: no gradient metric on encoders, no ``alti`` where a
            norm follows attention).
    """

    samples: int = 24
    max_tokens: int = 128
    rates: tuple[float, ...] = RATES
    sentences: int = 64
    sink_samples: int = 24
    per_layer_model: str = "smollm2-135m"
    per_layer_samples: int = 8
    per_layer_rate: float = 0.1
    batch_tokens: int = 2048
    seed: int = 0
    first_token_view: bool = True
    first_token_metrics: tuple[str, ...] = FIRST_TOKEN_METRICS
    decoder_metrics: tuple[str, ...] = metrics.NAMES
    encoder_metrics: tuple[str, ...] = field(
        default=tuple(m for m in metrics.NAMES if metrics.REGISTRY[m].source != "gradient"))


def model_dir(out, model: str) -> Path:
    """``<out>/<model>`` with path separators of hub ids / local paths replaced."""
    safe = str(model).strip("/").replace("/", "__").replace("\\", "__")
    return Path(out) / safe


FAITHFULNESS = "faithfulness/fineweb_edu.jsonl"
ENCODER_FAITHFULNESS = "faithfulness/fineweb_edu_sentences.jsonl"
# the second view: the first token never masked (same file name with this suffix)
FIRST_TOKEN_KEPT = "_first_token_kept"


def first_token_kept(path: str) -> str:
    """The second view's file of a faithfulness file (``x.jsonl`` -> ``x_first_token_kept.jsonl``)."""
    stem, dot, ext = path.rpartition(".")
    return f"{stem}{FIRST_TOKEN_KEPT}{dot}{ext}"
PER_LAYER = "per_layer/fineweb_edu.jsonl"
SINKS = "sinks"
TOKEN_CLASSES = "token_classes.csv"


def has_results(out, model: str) -> bool:
    """Whether ``<out>/<model>`` holds anything a table can be built from."""
    folder = model_dir(out, model)
    return any((folder / rel).exists() for rel in
               (FAITHFULNESS, ENCODER_FAITHFULNESS, PER_LAYER, f"{SINKS}/summary.json", TOKEN_CLASSES))
