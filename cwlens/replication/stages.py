"""The stages of ``cwlens replicate`` on one model, each resumable.

Faithfulness runs append one sample at a time (:class:`~cwlens.faithfulness.results.ResultsWriter`),
the sink analysis saves each batch (:func:`cwlens.sinks.run.run_to_folder`), the token-class
table is written atomically once computed; a rerun skips what is on disk.
"""

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from cwlens.datasets import load_dataset
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle
from cwlens.engine.models.registry import model_label
from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
from cwlens.faithfulness.encoder import BATCH_SIZE, embedding_damage, sentences
from cwlens.faithfulness.ranking import MODES
from cwlens.faithfulness.rows_job import RowsJob
from cwlens.replication import plan
from cwlens.replication.plan import ReplicationConfig
from cwlens.runs.jobs import JobSpec, run_job
from cwlens.runs.results_io import atomic_write_text

Log = Callable[[str], None]


@takes_model
def run_model(model: ModelLike, name: str, out, cfg: ReplicationConfig, log: Log = print,
              progress: bool = True) -> Path:
    """Every stage for ``model`` (loaded, called ``name``) into ``<out>/<name>``."""
    folder = plan.model_dir(out, name)
    folder.mkdir(parents=True, exist_ok=True)
    if model.is_encoder:
        encoder_faithfulness(model, name, folder / plan.ENCODER_FAITHFULNESS, cfg, log, progress)
        if cfg.first_token_view:
            encoder_faithfulness(model, name, folder / plan.first_token_kept(plan.ENCODER_FAITHFULNESS),
                                 first_token_config(cfg), log, progress, mask_first_token=False)
    else:
        decoder_faithfulness(model, name, folder / plan.FAITHFULNESS, cfg, log, progress)
        if cfg.first_token_view:
            decoder_faithfulness(model, name, folder / plan.first_token_kept(plan.FAITHFULNESS),
                                 first_token_config(cfg), log, progress, mask_first_token=False)
        if name == cfg.per_layer_model:
            per_layer(model, name, folder / plan.PER_LAYER, cfg, log, progress)
    sinks(model, name, folder / plan.SINKS, cfg, log, progress)
    token_classes(model, folder / plan.TOKEN_CLASSES, cfg, log)
    return folder


def first_token_config(cfg: ReplicationConfig) -> ReplicationConfig:
    """``cfg`` for the second view: its metrics limited to ``cfg.first_token_metrics``."""
    keep = set(cfg.first_token_metrics)
    return replace(cfg, decoder_metrics=tuple(m for m in cfg.decoder_metrics if m in keep),
                   encoder_metrics=tuple(m for m in cfg.encoder_metrics if m in keep))


LOGIT_BUDGET = 2**27  # batch tokens x vocabulary: 512 MB of float32 logits per batch


def batch_tokens(handle: ModelHandle, cfg: ReplicationConfig) -> int:
    """``cfg.batch_tokens``, lowered for a large vocabulary so that one batch's logits stay
    within :data:`LOGIT_BUDGET` entries (the gradient metrics keep them, and their float64
    loss, for the backward pass): SmolLM2 (49k) keeps 2048 tokens, Gemma-3 (262k) gets 512."""
    cap = max(cfg.max_tokens, LOGIT_BUDGET // handle.d_vocab)
    return min(cfg.batch_tokens, cap)


def faithfulness_config(cfg: ReplicationConfig, handle: ModelHandle | None = None, **changes):
    base = dict(metrics=cfg.decoder_metrics, rates=cfg.rates, max_tokens=cfg.max_tokens,
                batch_tokens=cfg.batch_tokens if handle is None else batch_tokens(handle, cfg),
                seed=cfg.seed)
    return FaithfulnessConfig(**{**base, **changes})


def decoder_faithfulness(handle: ModelHandle, name, path: Path, cfg: ReplicationConfig, log: Log, progress: bool,
                         mask_first_token: bool = True):
    """Value masking on FineWeb-Edu at every rate, every metric, both modes (ΔPPL, NLL);
    ``mask_first_token=False``: the second view, the first token never masked."""
    fc = faithfulness_config(cfg, handle, mask_first_token=mask_first_token)
    log(f"[{name}] faithfulness{'' if mask_first_token else ' (first token never masked)'}: "
        f"{cfg.samples} FineWeb-Edu documents x {len(fc.metrics)} metrics x {len(cfg.rates)} "
        f"rates x 2 modes -> {path}")
    result = run_faithfulness(handle, "fineweb_edu", fc, n=cfg.samples,
                              out=path, model_name=name, progress=progress)
    log(f"[{name}] faithfulness: {result.stats.n_batches} batches computed now "
        f"({result.stats.wall_seconds:.0f} s)")


def per_layer(handle: ModelHandle, name, path: Path, cfg: ReplicationConfig, log: Log, progress: bool):
    """The same test masking one layer at a time (one rate, a few metrics)."""
    fc = faithfulness_config(cfg, handle, metrics=plan.PER_LAYER_METRICS, rates=(cfg.per_layer_rate,),
                             per_layer=True)
    log(f"[{name}] per-layer masking: {cfg.per_layer_samples} documents x {handle.n_layers} "
        f"layers x {len(fc.metrics)} metrics, rate {cfg.per_layer_rate:g} -> {path}")
    run_faithfulness(handle, "fineweb_edu", fc, n=cfg.per_layer_samples, out=path, model_name=name,
                     progress=progress)


def encoder_faithfulness(handle: ModelHandle, name, path: Path, cfg: ReplicationConfig, log: Log, progress: bool,
                         mask_first_token: bool = True):
    """The sentence-embedding damage (:func:`cwlens.faithfulness.encoder.embedding_damage`)
    on ``cfg.sentences`` FineWeb-Edu sentences, written in the faithfulness results format
    (``measure = "embedding_damage"``, ``tied_share``, ``first_token_share``) one sample at
    a time; batches are fixed by the sentence order, so a resumed run computes the numbers
    of an uninterrupted one (a :class:`~cwlens.runs.jobs.Job`: :class:`EncoderDamageJob`)."""
    texts = sentences("fineweb_edu", cfg.sentences)
    metrics, rates = cfg.encoder_metrics, cfg.rates
    config = {"model": name, "dataset": "fineweb_edu_sentences", "metrics": list(metrics),
              "rates": list(rates), "modes": list(MODES), "scope": "row", "kind": "inter",
              "batch_size": BATCH_SIZE, "seed": cfg.seed, "samples": [i for i, _ in texts],
              "mask_first_token": mask_first_token}
    log(f"[{name}] encoder faithfulness: {len(texts)} sentences x {len(metrics)} metrics x "
        f"{len(rates)} rates x 2 modes -> {path}")
    spec = JobSpec("encoder faithfulness configuration", config, path.parent, True, len(texts),
                   f"{name} sentences", "sentence", progress)
    run_job(EncoderDamageJob(handle, name, texts, cfg, spec, path, mask_first_token))


class EncoderDamageJob(RowsJob):
    """Items: chunks of :data:`~cwlens.faithfulness.encoder.BATCH_SIZE` sentences (one
    forward pass each) holding an unfinished one."""

    MEASURES = ("embedding_damage", "tied_share", "first_token_share")

    def __init__(self, handle: ModelHandle, name, texts, cfg: ReplicationConfig, spec, path, mask_first_token):
        self.handle, self.cfg, self.mask_first_token = handle, cfg, mask_first_token
        self.chunks = [texts[s : s + BATCH_SIZE] for s in range(0, len(texts), BATCH_SIZE)]
        self.columns = {"model": name, "dataset": "fineweb_edu_sentences", "scope": "row",
                        "kind": "inter", "renormalize": False, "causal_only": False,
                        "mask_first_token": mask_first_token, "max_tokens": None, "seed": cfg.seed}
        per_sample = len(cfg.encoder_metrics) * len(cfg.rates) * len(MODES) * len(self.MEASURES)
        super().__init__(spec, path, per_sample, [i for i, _ in texts])

    def todo(self):
        return [c for c in self.chunks if any(i not in self.writer.done for i, _ in c)]

    def do(self, chunk):
        rows = embedding_damage(self.handle, chunk, self.cfg.encoder_metrics, self.cfg.rates,
                                seed=self.cfg.seed, mask_first_token=self.mask_first_token)
        written = 0
        for sid, _ in chunk:
            if sid in self.writer.done:
                continue
            self.writer.write_sample([
                {**self.columns, "metric": r["metric"], "mode": r["mode"], "rate": r["rate"],
                 "sample_id": sid, "layers": "all", "measure": m,
                 "value": r["damage" if m == "embedding_damage" else m]}
                for r in rows if r["sample_id"] == sid for m in self.MEASURES])
            written += 1
        return written


def sinks(handle: ModelHandle, name, folder: Path, cfg: ReplicationConfig, log: Log, progress: bool):
    """The sink analysis on GSM8K texts; the sink-norm intervention on decoders only."""
    # here, not at the top: cwlens.sinks.run imports pandas
    from cwlens.sinks import run as sink_run

    intervention = not handle.is_encoder
    samples = load_dataset("gsm8k", cfg.sink_samples)
    log(f"[{name}] sinks: {len(samples)} GSM8K texts"
        f"{'' if intervention else ' (no intervention: it needs a next-token loss)'} -> {folder}")
    tables = sink_run.run_to_folder(handle, samples, folder, max_tokens=cfg.max_tokens,
                                    intervention=intervention, seed=cfg.seed, progress=progress,
                                    model_name=name)
    summary = sink_run.summarize(tables)
    summary.update({"model": name, "model_label": model_label(name), "dataset": "gsm8k",
                    "max_tokens": cfg.max_tokens})
    sink_run.write_summary(summary, folder)


def token_classes(handle: ModelHandle, path: Path, cfg: ReplicationConfig, log: Log):
    """Attention vs norm-weighted share of [CLS]/BOS, [SEP]/EOS, punctuation, other tokens."""
    if path.exists():
        return
    # here, not at the top: cwlens.sinks.token_classes imports pandas
    from cwlens.sinks import token_classes as tc

    log(f"[token classes] {cfg.sentences} FineWeb-Edu sentences -> {path}")
    df = tc.class_shares(handle, sentences("fineweb_edu", cfg.sentences), max_tokens=cfg.max_tokens)
    atomic_write_text(path, df.to_csv(index=False))
