"""``cwlens replicate``: every claim of the paper on several models, one table."""

import argparse
import json
import time

import pandas as pd

import cwlens
from cwlens.cli import arg_types
from cwlens.cli.common import (
    add_debug_flag,
    add_figures_flag,
    add_progress_flag,
    figures_dir,
    note_ignored,
    stored_differences,
)
from cwlens.errors import CwlensError, InvalidArgumentError, ModelNotAvailableError
from cwlens.faithfulness.report import check_block, write_block
from cwlens.replication import claims
from cwlens.replication.plan import (
    DEFAULT_MODELS,
    ENCODER_FAITHFULNESS,
    FAITHFULNESS,
    ReplicationConfig,
    has_results,
    model_dir,
)
from cwlens.replication.stages import run_model
from cwlens.runs.progress import status
from cwlens.sinks.store import SinkResultsError

DESCRIPTION = """\
Runs, for each model, the faithfulness test at removal rates 0.01..0.99 (ERASER's bins read
as removed and as kept fractions) with every metric (the paper's four, |contribution|, the
peers' ALTI and its attention-only variant, the supervised attention x gradient, the random
control), again with the first token never masked (the label-free metrics), the sink analysis (with the sink-norm intervention on decoders), the
token-class shares (attention vs norm-weighted on [CLS]/BOS, [SEP]/EOS, punctuation), and
on one decoder the per-layer masking; then writes one table of claims x models, the AOPC
tables and the perturbation-curve figures.
Decoders: language modelling on FineWeb-Edu documents (damage = ΔNLL). Encoders: the
sentence-embedding damage 1 - cos (mean pooling) on FineWeb-Edu sentences.
Each stage writes as it goes into <out>/<model>/: rerun the same command to resume; a
model that cannot be loaded (e.g. its package is not installed) is reported and skipped.
"""

EPILOG = """\
examples:
  cwlens replicate                                   # the three offline models (hours on 2 CPU cores)
  cwlens replicate --models smollm2-135m --samples 8 # a quick look
  cwlens replicate --table-only --out results/replicate --figures figures --docs docs/replication.md
offline models: smollm2-135m (default install), gemma-3-270m (scripts/setup.sh --gemma),
all-minilm-l6-v2 (scripts/setup.sh --minilm).
"""


def register(sub) -> None:
    d = ReplicationConfig()
    p = sub.add_parser("replicate", help="the paper's claims on several models: one resumable run, "
                       "one table", description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(DEFAULT_MODELS), type=_models,
                   help="comma-separated model names, local directories or hub ids "
                   "(default: %(default)s)")
    p.add_argument("--device", default=None, type=arg_types.device,
                   help="cpu, cuda, cuda:1, mps (default: cuda if available)")
    p.add_argument("--out", default="runs/replicate", help="results folder (default: %(default)s)")
    g = p.add_argument_group("sizes")
    g.add_argument("--samples", type=arg_types.positive_int, default=d.samples,
                   help="FineWeb-Edu documents per decoder faithfulness run (default: %(default)s)")
    g.add_argument("--max-tokens", type=arg_types.max_tokens, default=d.max_tokens,
                   help="tokens per document (default: %(default)s)")
    g.add_argument("--rates", type=_rates, default=d.rates,
                   help="removal rates of the curves (default: " + ",".join(f"{r:g}" for r in d.rates) + ")")
    g.add_argument("--sentences", type=arg_types.positive_int, default=d.sentences,
                   help="FineWeb-Edu sentences: encoder task and token classes (default: %(default)s)")
    g.add_argument("--sink-samples", type=arg_types.positive_int, default=d.sink_samples,
                   help="GSM8K texts of the sink analysis (default: %(default)s)")
    g.add_argument("--per-layer-model", default=None,
                   help="the model (one of --models) masked one layer at a time, '' for none "
                   f"(default: {d.per_layer_model} when it is in --models)")
    g.add_argument("--per-layer-samples", type=arg_types.positive_int, default=d.per_layer_samples,
                   help="documents of the per-layer run (default: %(default)s)")
    g = p.add_argument_group("output")
    g.add_argument("--table-only", action="store_true",
                   help="do not compute: build the table from what --out holds")
    add_figures_flag(g)
    g.add_argument("--no-png", action="store_true", help="figures as HTML only")
    g.add_argument("--docs", default=None, help="also write the tables into this markdown page, "
                   "between its replication markers (docs/replication.md)")
    add_progress_flag(g)
    add_debug_flag(p, argparse.SUPPRESS)
    p.set_defaults(func=run)


def _rates(text: str) -> tuple[float, ...]:
    """:func:`arg_types.rates` with at least one rate strictly between 0 and 1: removing
    nothing (0) or everything (1) damages every metric alike, so every verdict would tie."""
    values = arg_types.rates(text)
    if not any(0.0 < r < 1.0 for r in values):
        raise argparse.ArgumentTypeError(
            f"every rate in {text!r} is 0 or 1: removing nothing or everything damages every "
            "metric alike, so every verdict would be a tie; pass rates between 0 and 1, e.g. "
            "0.1,0.3,0.5")
    return values


def _models(text: str) -> tuple[str, ...]:
    items = [t.strip() for t in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError("--models needs at least one model name")
    if not all(items):
        raise argparse.ArgumentTypeError(f"--models {text!r} has an empty name between commas; "
                                         "pass e.g. smollm2-135m,gemma-3-270m")
    if len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"--models lists a model twice: {text!r}")
    return tuple(items)


def run(args) -> int:
    figures, per_layer_model = figures_dir(args), args.per_layer_model
    if per_layer_model is None:
        default = ReplicationConfig().per_layer_model
        per_layer_model = default if default in args.models else ""
    elif per_layer_model:
        same = [m for m in args.models if m.rstrip("/") == per_layer_model.rstrip("/")]
        if not same:  # (a trailing slash on a directory names the same model)
            raise InvalidArgumentError(
                f"--per-layer-model {per_layer_model!r} is not one of --models "
                f"({','.join(args.models)}): name one of them, or '' for no per-layer run")
        per_layer_model = same[0]
    cfg = ReplicationConfig(samples=args.samples, max_tokens=args.max_tokens, rates=args.rates,
                            sentences=args.sentences, sink_samples=args.sink_samples,
                            per_layer_model=per_layer_model,
                            per_layer_samples=args.per_layer_samples)
    out = arg_types.output_dir(args.out, must_write=not args.table_only)
    if figures:
        arg_types.output_dir(figures, "--figures")
    if args.docs:
        arg_types.markdown_file(args.docs, "--docs")
        check_block(args.docs, claims.START, claims.END)
    skipped: dict[str, str] = {}
    if args.table_only:
        if not any(has_results(out, name) for name in args.models):
            raise InvalidArgumentError(
                f"--table-only: {str(out)!r} holds no results for {','.join(args.models)}; run "
                "`cwlens replicate` without --table-only first, or pass the --out of that run")
        _note_stored_sizes(args, out)
    else:
        skipped = _compute(args, cfg, out)
    return _report(args, out, skipped, figures)


def _note_stored_sizes(args, out) -> None:
    """--table-only builds the table from the stored rows as they are: a note (stderr) for
    each size flag given another value than its default and than a stored run's."""
    d = ReplicationConfig()
    for name in args.models:
        for rel, count_flag, count in ((FAITHFULNESS, "--samples", args.samples),
                                       (ENCODER_FAITHFULNESS, "--sentences", args.sentences)):
            path = model_dir(out, name) / rel.replace(".jsonl", ".config.json")
            try:
                stored = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            differ = []
            ids = stored.get("samples")
            default = d.samples if count_flag == "--samples" else d.sentences
            if isinstance(ids, list) and count != default and count != len(ids):
                differ.append(f"{count_flag} {len(ids)} (asked: {count})")
            differ += stored_differences(stored, {
                "--rates": ("rates", [float(r) for r in args.rates], [float(r) for r in d.rates]),
                "--max-tokens": ("max_tokens", args.max_tokens, d.max_tokens)})
            note_ignored("--table-only", "builds the table from the stored results", name, differ)


def _compute(args, cfg, out) -> dict[str, str]:
    skipped = {}
    for name in args.models:
        t0 = time.perf_counter()
        try:
            status(f"loading {name} ...", not args.no_progress)
            model = cwlens.load_model(name, device=args.device)
        except ModelNotAvailableError as err:
            why = " ".join(str(err).split())
            why = why if len(why) <= 160 else why[:157] + "..."
            print(f"[{name}] skipped: {why}")
            skipped[name] = why
            continue
        run_model(model, name, out, cfg, progress=not args.no_progress)
        print(f"[{name}] done in {time.perf_counter() - t0:.0f} s")
        del model
    return skipped


def _load(claims, out, name):
    """:func:`cwlens.replication.claims.load`, a damaged stored table named with its fix."""
    try:
        return claims.load(out, name)
    except (json.JSONDecodeError, UnicodeDecodeError, pd.errors.EmptyDataError,
            pd.errors.ParserError, SinkResultsError) as e:
        raise CwlensError(
            f"a stored table of {name} under {out} cannot be read ({type(e).__name__}: {e}): "
            "it is damaged. Move that file away and rerun `cwlens replicate` without "
            "--table-only (a resumed run rebuilds what is missing).") from None


def _report(args, out, skipped: dict[str, str], figures: str) -> int:
    results = [_load(claims, out, name) for name in args.models]
    table = claims.claims_table(results)
    aopc = claims.aopc_tables(results)
    print("\n" + table + "\n" + aopc)
    for name, why in skipped.items():
        print(f"note: {name} was skipped ({why}); its column reads n/a.")
    if skipped and len(skipped) == len(args.models):
        raise ModelNotAvailableError("no model could be loaded: " + "; ".join(
            f"{name}: {why}" for name, why in skipped.items()))
    command = ("cwlens replicate " + " ".join(f"--{k} {v}" for k, v in _nondefault(args))).strip()
    if args.docs:  # the tables first: they hold the numbers, the figures only draw them
        write_block(args.docs, f"Produced by `{command}`.\n\n{table}\n{aopc}",
                    start=claims.START, end=claims.END)
        print(f"wrote {args.docs}")
    if figures:
        written = claims.write_figures(results, figures, png=not args.no_png)
        if written:
            print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _nondefault(args):
    """The sizing options that differ from their defaults (for the 'produced by' line)."""
    d = ReplicationConfig()
    pairs = [("models", ",".join(args.models), ",".join(DEFAULT_MODELS)),
             ("samples", args.samples, d.samples), ("max-tokens", args.max_tokens, d.max_tokens),
             ("sentences", args.sentences, d.sentences),
             ("sink-samples", args.sink_samples, d.sink_samples),
             ("per-layer-samples", args.per_layer_samples, d.per_layer_samples)]
    return [(k, v) for k, v, default in pairs if v != default]
