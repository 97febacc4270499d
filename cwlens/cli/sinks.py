"""``cwlens sinks``: the attention-sink analysis on a dataset sample (tables, figures, summary)."""

import argparse
import json
import math
from pathlib import Path

from cwlens.cli import arg_types
from cwlens.cli.common import (
    DEFAULT_MODEL,
    add_figures_flag,
    add_model_args,
    add_past_context_flag,
    add_progress_flag,
    figures_dir,
    load_handle,
    note_ignored,
    stored_differences,
)
from cwlens.cli.placement import HELP as PLACEMENT_HELP
from cwlens.cli.placement import add_placement_args, load_kwargs
from cwlens.datasets import load_dataset
from cwlens.datasets.registry import DATASET_NAMES
from cwlens.engine.models.registry import model_label
from cwlens.errors import InvalidArgumentError
from cwlens.runs import distributed
from cwlens.runs.results_io import results_lock
from cwlens.sinks import run as sink_run
from cwlens.sinks.config import SinkConfig

DEFAULT = SinkConfig()  # the flags' defaults are the configuration's
SAMPLES = 50  # --samples' default: texts per dataset


def register(sub) -> None:
    p = sub.add_parser(
        "sinks",
        help="attention-sink analysis: sink rate vs contribution, anti-alignment, the sink-rate "
        "curve, sink-norm interventions",
        description="Runs the model on a dataset sample and writes tidy CSV tables (per sample, "
        "layer and head), figures (HTML + PNG) and summary.json: sink rate and sink heads "
        "(Gu et al. eps), sink contribution vs attention and the factor split sink vs tail; "
        "cosines of the sink's projected value with the tail's values and the head output; "
        "the sink-rate sweep with its closed form, s* and the actual rate; and Delta-PPL, "
        "head-output norms and cone cosines when the sink's value is scaled (with a random "
        "non-sink position as control). The sink is the first real token of each text. Each batch "
        "is saved in <out>/raw as it finishes: rerun the same command to resume after an "
        "interruption; the tables are then written (atomically) from the saved batches.",
        epilog=PLACEMENT_HELP % {"cmd": "sinks"},
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p)
    add_placement_args(p)
    p.add_argument("--dataset", default="gsm8k", type=arg_types.dataset_list(("text",)),
                   help="gsm8k, fineweb_edu, or both comma-separated (default: %(default)s)")
    p.add_argument("--samples", type=arg_types.positive_int, default=SAMPLES,
                   help="texts per dataset (default: %(default)s)")
    p.add_argument("--max-tokens", type=arg_types.max_tokens, default=DEFAULT.max_tokens,
                   help="truncate each text (default: %(default)s)")
    add_past_context_flag(p)
    p.add_argument("--batch-size", type=arg_types.positive_int, default=DEFAULT.batch_size,
                   help="texts per forward pass (default: %(default)s)")
    p.add_argument("--scales", default=",".join(f"{s:g}" for s in DEFAULT.scales), type=arg_types.scales,
                   help="sink-value scales for the intervention, comma-separated (default: %(default)s)")
    p.add_argument("--eps", type=arg_types.fraction, default=DEFAULT.eps,
                   help="sink-head threshold, in [0, 1] (default: %(default)s)")
    p.add_argument("--no-intervention", action="store_true", help="skip the forward passes with hooks")
    p.add_argument("--seed", type=int, default=DEFAULT.seed, help="seed of the random control positions")
    p.add_argument("--out", default="runs/sinks", help="folder for tables (default: %(default)s)")
    add_figures_flag(p)
    p.add_argument("--no-png", action="store_true", help="write HTML only (no Chromium needed)")
    p.add_argument("--plot-only", action="store_true",
                   help="redraw the figures from the tables already in --out")
    p.add_argument("--no-resume", action="store_true",
                   help="start afresh (default: each batch is saved in --out/raw as it finishes, "
                   "and rerunning the same command computes only the missing batches)")
    add_progress_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    figures = figures_dir(args)
    if args.plot_only and not Path(args.out).is_dir():
        raise sink_run.SinkResultsError(
            f"--plot-only: no results folder {args.out}; run `cwlens sinks` without --plot-only first.")
    if not args.plot_only:
        arg_types.output_dir(args.out)  # before the lock creates it
    if args.plot_only:  # under torchrun, rank 0 alone redraws
        env = distributed.launched()
        if env is not None and not env.main:
            return 0
        with results_lock(args.out):
            return _run(args, figures)
    placed = load_kwargs(args)
    with distributed.session() as world:  # torchrun: one process group for the command
        with results_lock(args.out):  # one run per results folder (torchrun: per job)
            return _run(args, figures, placed, world)


def _run(args, figures: str, placed=None, world=None) -> int:
    label = model_label(args.model)
    dataset = ",".join(args.dataset)
    if figures:  # "" (as in faithfulness and replicate): no figures
        arg_types.output_dir(figures, "--figures")
    elif args.plot_only:
        raise InvalidArgumentError("--plot-only draws figures: give a --figures folder")
    if args.plot_only:
        out = arg_types.output_dir(args.out, must_write=False)
        tables = sink_run.load_tables(out)
        missing = [k for k in ("layers", "heads") if k not in tables]
        if missing:
            raise InvalidArgumentError(
                f"--plot-only: {out} has no sink tables ({', '.join(missing)} missing); run "
                "`cwlens sinks` without --plot-only first, or pass the --out of that run"
            )
    else:
        arg_types.output_dir(args.out)
        samples: list = []
        for name in args.dataset:  # before the model: a bad count fails fast
            samples += load_dataset(name, n=args.samples)
        handle = load_handle(args, **(placed or {"device": args.device}))
        main = world is None or world.main
        if main:
            ranks = f" over {world.size} processes" if world is not None and world.size > 1 else ""
            print(f"cwlens sinks: {args.model} on {len(samples)} texts of {dataset} "
                  f"(first {args.max_tokens} tokens each){ranks}")
        config = SinkConfig(max_tokens=args.max_tokens, batch_size=args.batch_size,
                            scales=tuple(args.scales), eps=args.eps,
                            intervention=not args.no_intervention, seed=args.seed,
                            past_context=args.past_context)
        tables = sink_run.run_to_folder(handle, samples, args.out, config,
                                        resume=not args.no_resume, model_name=args.model,
                                        progress=not args.no_progress)
        if not main:
            return 0  # rank 0 writes the summary and the figures
        print(f"wrote {len(tables)} tables to {args.out}/")
    eps = _stored_eps(args) if args.plot_only else args.eps
    summary = sink_run.summarize(tables, eps)
    run_info = {"model": args.model, "model_label": label, "dataset": dataset,
                "max_tokens": args.max_tokens}
    if args.plot_only:  # keep what the run that made the tables recorded
        run_info.update(_stored_run_info(args.out))
        label = run_info["model_label"]
    summary.update(run_info)
    if not (args.plot_only and _same_summary(summary, args.out)):  # read-only folders: no write
        sink_run.write_summary(summary, args.out)
    print(sink_run.format_summary(summary))
    from cwlens.plotting.sinks import all_figures  # heavy (plotly)

    if figures:  # the titles say what the figures were made from
        source = (f"{label}, {summary['n_samples']} {summary['dataset']} texts (first "
                  f"{summary['max_tokens']} tokens)")
        written = all_figures(tables, figures, model_label=source, png=not args.no_png)
        print("wrote " + ", ".join(str(p) for p in written))
    return 0


def _stored_config(out) -> dict:
    """The run's ``raw/config.json`` ({} when absent or unreadable: tables from before it)."""
    try:
        stored = json.loads((Path(out) / "raw" / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def _stored_datasets(stored: dict) -> list[str] | None:
    """The datasets of the stored run, from its sample ids (``gsm8k-0000``); None where an
    id is not one of a shipped dataset's."""
    ids = stored.get("samples")
    if not isinstance(ids, list) or not ids:
        return None
    names = [str(i).rsplit("-", 1)[0] for i in ids]
    if not all(n in DATASET_NAMES for n in names):
        return None
    return list(dict.fromkeys(names))


def _stored_run_info(out) -> dict:
    """What the run that made the tables recorded: summary.json where it can be read, else
    its ``raw/config.json`` (model, max_tokens; the dataset from the sample ids), never
    this command's flags, which redrawing does not follow."""
    stored = _stored_config(out)
    info: dict = {}
    if "model" in stored:
        info.update(model=stored["model"], model_label=model_label(stored["model"]))
    if "max_tokens" in stored:
        info["max_tokens"] = stored["max_tokens"]
    datasets = _stored_datasets(stored)
    if datasets:
        info["dataset"] = ",".join(datasets)
    try:
        info.update(sink_run.read_run_info(out))
    except ValueError:  # a summary.json cut short: it is rewritten from the tables
        pass
    return info


def _stored_eps(args) -> float:
    """--plot-only: the eps the stored tables' sink heads were chosen with (the run's
    ``raw/config.json``), and a note (stderr) for each flag given another value than its
    default and than the stored run's, which redrawing does not follow."""
    stored = _stored_config(args.out)
    if "eps" not in stored:
        return args.eps  # tables from before the record: their eps is not known
    asked = {  # flag: (stored key, this command's value, the flag's default)
        "--eps": ("eps", args.eps, DEFAULT.eps),
        "--model": ("model", args.model, DEFAULT_MODEL),
        "--scales": ("scales", [float(x) for x in args.scales], [float(x) for x in DEFAULT.scales]),
        "--max-tokens": ("max_tokens", args.max_tokens, DEFAULT.max_tokens),
        "--seed": ("seed", args.seed, DEFAULT.seed),
        "--batch-size": ("batch_size", args.batch_size, DEFAULT.batch_size),
        "--no-intervention": ("intervention", not args.no_intervention, True),
    }
    differ = stored_differences(stored, asked)
    ids = stored.get("samples")
    datasets = _stored_datasets(stored)
    asked_datasets = list(args.dataset)
    if datasets and asked_datasets != ["gsm8k"] and asked_datasets != datasets:
        differ.append(f"--dataset {','.join(datasets)} (asked: {','.join(args.dataset)})")
    if isinstance(ids, list) and args.samples != SAMPLES and args.samples * len(args.dataset) != len(ids):
        of = f" of {len(args.dataset)} datasets" if len(args.dataset) > 1 else ""
        differ.append(f"{len(ids)} texts (asked: --samples {args.samples}{of})")
    note_ignored("--plot-only", "redraws the stored tables", args.out, differ,
                 " (the sink heads are the run's)")
    return float(stored["eps"])


def _same_summary(summary: dict, out_dir) -> bool:
    """Whether ``out_dir/summary.json`` already holds this summary (numbers within 1e-6:
    tables re-read from CSV round the last digits; a non-finite number is stored null)."""
    def same(a, b) -> bool:
        if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
            return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list) and isinstance(b, list):
            return len(a) == len(b) and all(map(same, a, b))
        return a == b

    try:
        old = json.loads((Path(out_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return same(old, json.loads(sink_run.to_json(summary)))
