"""``cwlens faithfulness``: how faithful is each importance metric? (value masking)"""

import argparse
import sys
from pathlib import Path

from cwlens.cli import arg_types
from cwlens.cli.accuracy import PROMPTS, prompt_of
from cwlens.cli.common import (
    DEFAULT_MODEL,
    add_figures_flag,
    add_model_args,
    add_past_context_flag,
    add_progress_flag,
    load_handle,
    note_ignored,
    stored_differences,
)
from cwlens.cli.faithfulness_request import FaithfulnessRequest
from cwlens.cli.placement import HELP as PLACEMENT_HELP
from cwlens.cli.placement import add_placement_args, load_kwargs
from cwlens.core import metrics
from cwlens.core.metrics import KINDS
from cwlens.datasets import ChoiceItem, load_dataset
from cwlens.datasets.chat_prompts import CHAT_DATASETS
from cwlens.datasets.registry import SPECS
from cwlens.engine.adapter import resolve_layers
from cwlens.engine.handle import ModelHandle
from cwlens.faithfulness import accuracy, aopc, report, results_report
from cwlens.faithfulness.config import RANKING_PATHS, FaithfulnessConfig
from cwlens.faithfulness.passes import sharing_note
from cwlens.faithfulness.ranking import ALL_RANKINGS, MODES, RANKINGS, SCOPES
from cwlens.faithfulness.results import config_path, read_config
from cwlens.faithfulness.results_report import AOPC_END, AOPC_START
from cwlens.faithfulness.sweep import run_faithfulness
from cwlens.runs import distributed
from cwlens.runs.progress import bar
from cwlens.runs.results_io import results_lock

DEFAULT = FaithfulnessConfig()  # the flags' defaults are the configuration's
STORED = {  # flag: the stored configuration's key (--report-only notes a flag it ignores)
    "--rates": "rates", "--modes": "modes", "--scope": "scope", "--kind": "kind",
    "--layers": "layers", "--per-layer": "per_layer", "--non-causal": "causal_only",
    "--protect-first-token": "mask_first_token", "--renormalize": "renormalize",
    "--seed": "seed", "--max-tokens": "max_tokens", "--past-context": "past_context"}

DESCRIPTION = """\
Ranks every attention entry (layer, head, query i, key j) by an importance metric, removes
the term a_ij * v~_j of the top-ranked entries (comprehensiveness) or of the bottom-ranked
ones (sufficiency) from the heads' outputs, and measures the damage:
  language modelling (gsm8k, fineweb_edu):  ΔPPL = PPL(masked) - PPL(clean)
  multiple choice (mmlu, winogrande, boolq): accuracy, log-likelihood scoring as
                                             lm-eval-harness (summed and length-normalised)
A faithful metric does much damage in comprehensiveness and little in sufficiency.
Metrics: attention, value_weighted, value_weighted_output_normalized, contribution
(signed), contribution_abs, random (seeded control).

Rows are appended to <out>/<dataset>.jsonl (--compress: .jsonl.gz) as each sample finishes: rerun the same
command to resume after an interruption. At the end it prints a summary (mean and 95%
bootstrap CI per cell), writes <out>/figures/faithfulness_<dataset>.png/.html (--figures
figures: the repository's figures/) and, with --summary-md, the results tables into a
markdown file.
"""

EPILOG = """\
examples:
  cwlens faithfulness --dataset gsm8k --samples 50 --rates 0.1,0.3,0.5
  cwlens faithfulness --dataset gsm8k,fineweb_edu,mmlu,winogrande,boolq \\
      --samples gsm8k=50,fineweb_edu=50,mmlu=100,winogrande=100,boolq=100 --max-tokens 256
  cwlens faithfulness --dataset mmlu --num-fewshot 5 --samples 100 --scope layer
  cwlens faithfulness --dataset gsm8k --report-only --summary-md docs/faithfulness.md
""" + PLACEMENT_HELP % {"cmd": "faithfulness"}


def _metrics_help() -> str:
    extra = [m for m in metrics.NAMES if m not in metrics.DEFAULT]
    return (f"comma-separated metrics or 'all' (default: all = {', '.join(metrics.DEFAULT)}); "
            f"also: {', '.join(extra)} (attention_gradient*: supervised references, one "
            "backward pass per batch; alti: O(n^2 d_model) per layer)")


def register(sub) -> None:
    p = sub.add_parser(
        "faithfulness", help="comprehensiveness/sufficiency of importance metrics by value masking",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p)
    add_placement_args(p)
    g = p.add_argument_group("data")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--dataset", default="gsm8k", type=arg_types.dataset_list(),
                     help="comma-separated: gsm8k, fineweb_edu, mmlu, winogrande, boolq, and the "
                     "circuit tasks ioi, induction, capitals (default: %(default)s)")
    src.add_argument("--file", type=arg_types.text_file, default=None,
                     help="instead of --dataset: one UTF-8 text file scored as one language-"
                     "modelling document ('-': standard input), e.g. a long text with "
                     "--max-tokens 16384 (results in <out>/file_<name>.jsonl)")
    g.add_argument("--samples", default=None, type=arg_types.samples_spec,
                   help="samples per dataset: one number, or name=N,... (default: 50)")
    g.add_argument("--num-fewshot", type=int, default=0, choices=range(6), metavar="{0..5}",
                   help="MMLU exemplars from the dev split, 0-5 (default: 0)")
    g.add_argument("--prompt", choices=PROMPTS, default="plain",
                   help="plain: lm-eval's prompts; chat: mmlu and boolq as a user turn of the "
                   "model's chat template, zero-shot, results in <out>/<dataset>_chat.jsonl (see "
                   "cwlens accuracy --prompt chat; default: %(default)s)")
    g.add_argument("--require-above-chance", action="store_true",
                   help="multiple-choice datasets: measure the clean accuracy first and refuse a "
                   "dataset whose exact 95%% interval does not clear chance (see cwlens accuracy); "
                   "resuming, the items already in the results file are read from their rows")
    g.add_argument("--max-tokens", type=arg_types.max_tokens, default=DEFAULT.max_tokens,
                   help="truncate language-modelling documents to their first N tokens (default: %(default)s)")
    add_past_context_flag(p)
    p.add_argument("--no-bos", action="store_true",
                   help="tokenize texts and choices without the BOS token TransformerLens "
                   "prepends by default (for a model trained without one)")
    g = p.add_argument_group("masking protocol (defaults: see docs/faithfulness.md)")
    g.add_argument("--metrics", default=None,
                   type=arg_types.choice_list(ALL_RANKINGS, "metric", allow_all=RANKINGS),
                   help=_metrics_help())
    g.add_argument("--rates", default=",".join(map(str, DEFAULT.rates)), type=arg_types.rates, help="removal rates in [0, 1] (default: %(default)s)")
    g.add_argument("--modes", default=",".join(DEFAULT.modes),
                   type=arg_types.choice_list(MODES, "mode"),
                   help=f"comma-separated, from {', '.join(MODES)} (default: %(default)s)")
    g.add_argument("--scope", default=DEFAULT.scope, choices=SCOPES,
                   help="ranking unit: per head-and-query row, per head, per layer (default: %(default)s)")
    g.add_argument("--layers", default="all", type=arg_types.layers_or_all, help="'all' or comma-separated layer indices (default: all)")
    g.add_argument("--per-layer", action="store_true", help="mask one layer at a time (n_layers x the cost)")
    g.add_argument("--kind", default=DEFAULT.kind, choices=KINDS[::-1],
                   help="output that the value-aware metrics project on (default: %(default)s)")
    g.add_argument("--protect-first-token", action="store_true",
                   help="never mask the first token (BOS / attention sink); default: it may be masked")
    g.add_argument("--non-causal", action="store_true",
                   help="let keys j > i count as eligible; on a decoder they have attention 0, "
                   "so the rates then count keys the model never reads (default: causal, j <= i)")
    g.add_argument("--renormalize", action="store_true",
                   help="give removed attention mass back to the other keys (default: no)")
    g.add_argument("--seed", type=int, default=DEFAULT.seed, help="seed of the random control (default: %(default)s)")
    g.add_argument("--ranking-path", default=DEFAULT.ranking_path, choices=RANKING_PATHS,
                   help="how row-scope masks are made, same results: whole_layer (rank each layer's "
                   "n x n in the clean pass), lockstep (clean and masked copies in one pass, ranked "
                   "per query block: long documents), auto: lockstep where attention runs blockwise "
                   "(default: %(default)s; docs/long_context.md)")
    g = p.add_argument_group("output")
    g.add_argument("--out", default="runs/faithfulness", help="results folder (default: %(default)s)")
    g.add_argument("--batch-tokens", type=arg_types.positive_int, default=DEFAULT.batch_tokens, help="padded tokens per forward pass (default: %(default)s)")
    g.add_argument("--no-resume", action="store_true", help="start the results files afresh")
    g.add_argument("--compress", action="store_true",
                   help="store the rows gzip-compressed, <out>/<dataset>.jsonl.gz (about 50x "
                   "smaller: multiple choice writes ~900 rows per item). A folder that holds "
                   "<dataset>.jsonl.gz is resumed from it without the flag")
    g.add_argument("--report-only", action="store_true", help="do not run: summarise existing results")
    add_figures_flag(g)
    g.add_argument("--no-png", action="store_true", help="figures as HTML only")
    g.add_argument("--summary-md", default=None, type=arg_types.markdown_list,
                   help="write the results tables into these markdown files, comma-separated "
                   "(between <!-- faithfulness-results:start/end --> comments; with three or "
                   "more rates also the AOPC tables, between <!-- faithfulness-aopc:start/end -->)")
    add_progress_flag(g)
    p.set_defaults(func=run)


def _source(args, handle, dataset: str, n: int):
    """What run_faithfulness and the chance check score: the dataset's name, or under
    ``--prompt chat`` its chat items (``cwlens.datasets.chat_prompts``)."""
    if prompt_of(dataset, args.prompt) != "chat":
        return dataset
    return load_dataset(dataset, n=n, chat=handle.chat_prompt)


def _note_unused_flags(args, datasets) -> None:
    """A note (stderr) for a flag this run does not use, so nobody reads its absence into
    the numbers: --require-above-chance and --prompt chat act on multiple-choice datasets
    (chat: those with a chat form) only."""
    def kind(d):
        return SPECS[d].info.kind if d in SPECS else "text"  # --file: one document

    if args.require_above_chance and not args.report_only and all(kind(d) == "text" for d in datasets):
        print("cwlens: note: --require-above-chance checks multiple-choice datasets only; "
              f"{', '.join(datasets)} (scored by next-token loss) have no chance level: ignored",
              file=sys.stderr)
    if args.max_tokens != DEFAULT.max_tokens and not any(kind(d) == "text" for d in datasets):
        print(f"cwlens: note: --max-tokens truncates language-modelling documents only; "
              f"{', '.join(datasets)} (multiple choice) are scored whole: ignored", file=sys.stderr)
    if args.non_causal and not args.report_only:
        print("cwlens: note: --non-causal on a decoder: the future keys j > i (attention 0 in "
              "every metric, never read by the model) count as eligible, so a rate r masks "
              "round(r x n) of all n keys of a row instead of its i + 1 visible ones, and "
              "sufficiency mostly removes zeros. Leave it out for the causal protocol "
              "(docs/faithfulness.md, 'eligible entries')", file=sys.stderr)
    if args.prompt == "chat" and not any(d in CHAT_DATASETS for d in datasets):
        print(f"cwlens: note: --prompt chat applies to {', '.join(CHAT_DATASETS)} only: "
              f"{', '.join(datasets)} use their plain prompts", file=sys.stderr)


def run(args) -> int:
    req = FaithfulnessRequest.from_flags(args)
    _note_unused_flags(args, req.datasets)
    if args.report_only:  # under torchrun, rank 0 alone reports
        env = distributed.launched()
        return print_report(req) if env is None or env.main else 0
    placed = load_kwargs(args)
    with distributed.session() as world:  # torchrun: one process group for the command
        with results_lock(req.paths[0].parent):  # one run per results folder (torchrun: per job)
            return _run(req, placed, world)


def _run(req: FaithfulnessRequest, placed, world) -> int:
    args, cfg = req.flags, req.config
    handle = load_handle(args, **placed)
    if cfg.layers is not None:  # before any compute
        resolve_layers(handle.n_layers, list(cfg.layers))
    for d, path in zip(req.datasets, req.paths, strict=True):
        shots = args.num_fewshot if d == "mmlu" else 0
        source = req.file_samples if args.file is not None else _source(args, handle, d, req.counts[d])
        if args.require_above_chance and args.file is None:
            _check_chance(req, handle, d, source, world, path if not args.no_resume else None)
        result = run_faithfulness(
            handle, source, cfg, n=req.counts[d], num_fewshot=shots, out=path,
            resume=not args.no_resume, model_name=args.model, progress=not args.no_progress,
        )
        s = result.stats
        if world.main:
            ranks = f" over {world.size} processes" if world.size > 1 else ""
            print(f"{d}: {s.n_forwards} forward passes in {s.n_batches} batches{ranks}, "
                  f"{s.wall_seconds:.0f}s -> {path}")
            print(f"  {sharing_note(cfg.conditions(handle.n_layers), cfg)}")
    return print_report(req) if world.main else 0


def _check_chance(req: FaithfulnessRequest, handle: ModelHandle, name: str, dataset, world,
                  path) -> None:
    """A multiple-choice dataset ``name`` (``dataset``: the name, or its items): its clean
    accuracy must clear chance (else AtChanceError). Resuming ``path`` (None: not resumed),
    the items it already holds are read from their clean rows, not run again."""
    n, shots, cfg = req.counts[name], req.flags.num_fewshot if name == "mmlu" else 0, req.config
    model_name, progress = req.flags.model, not req.flags.no_progress
    items = load_dataset(dataset, n=n, num_fewshot=shots) if isinstance(dataset, str) else dataset
    if not items or not isinstance(items[0], ChoiceItem):
        return
    known = accuracy.written_accuracies(handle, items, cfg, path, model_name=model_name,
                                        num_fewshot=shots)
    left = sum(1 for item in items if item.id not in known)
    with bar(left, f"{items[0].dataset}: clean accuracy", "item",
             enabled=progress and world.main, ticks=True):
        check = accuracy.clean_accuracy(handle, items, batch_tokens=cfg.batch_tokens, known=known,
                                        prepend_bos=cfg.prepend_bos)
    if world.main:
        read = f" ({check.reused} of them read from {path})" if check.reused else ""
        print(f"clean accuracy: {check.line()}{read}", flush=True)
    accuracy.require_above_chance(check)


def print_report(req: FaithfulnessRequest) -> int:
    """Prints the tables of the request's results files (the AOPC tables too, with three
    or more rates), writes them into --summary-md and draws the figures."""
    args = req.flags
    only = args.metrics if args.report_only else None  # --report-only --metrics: their tables
    result = results_report.tables(req.paths, only)
    if only is not None:
        print(f"(tables limited to --metrics {','.join(only)})")
    if args.report_only:
        _note_stored_config(req)
    print(result.text)
    summary_md = list(filter(None, (args.summary_md or "").split(",")))
    for path in summary_md:
        report.write_block(path, result.text)
        print(f"tables written to {path}")
    if req.figures:
        from cwlens.plotting.faithfulness import faithfulness_curves  # heavy (plotly)

        for ds in sorted(result.summary.dataset.unique()):
            for suffix, model, rows in report.setting_groups(result.summary, ds):
                subset = sorted({x for x in rows.get("layers", []) if report.masked_layers(x)})
                where = f", layers {' / '.join(subset)}" if subset else ""
                fig = faithfulness_curves(rows, ds, report.main_measure(result.summary, ds),
                                          title=f"{ds} — {model or args.model} (value masking{where})")
                _save(fig, req, f"faithfulness_{ds}{suffix}")
    blocks: list[str] = []
    for section in results_report.aopc_sections(result.table):
        print(*section.parts, sep="\n")
        blocks += section.parts
        if req.figures:
            from cwlens.plotting.faithfulness import aopc_curves  # heavy (plotly)

            fig = aopc_curves(aopc.curve_summary(section.damage), section.summary,
                              f"{section.dataset} — {section.model or args.model}",
                              aopc.UNITS[section.measure])
            _save(fig, req, f"faithfulness_{section.dataset}{section.suffix}_aopc")
    aopc_text = "\n".join(blocks)
    for path in summary_md:
        if aopc_text:
            report.write_block(path, aopc_text, AOPC_START, AOPC_END)
            print(f"AOPC tables written to {path}")
        elif report.has_block(path, AOPC_START):  # an earlier run's AOPC would sit under new tables
            report.write_block(path, "No AOPC: these results have fewer than three masking rates.",
                               AOPC_START, AOPC_END)
            print(f"AOPC block in {path} cleared (fewer than three rates)")
    return 0


def _save(fig, req: FaithfulnessRequest, name: str) -> None:
    from cwlens.plotting import save_figure  # heavy (plotly)

    written = save_figure(fig, Path(req.figures) / name, png=not req.flags.no_png)
    print("figure:", ", ".join(map(str, written)))


def _note_stored_config(req: FaithfulnessRequest) -> None:
    """--report-only summarises the stored rows as they are: a note (stderr) for each
    flag given another value than its default and than the stored run's, which the
    report therefore does not follow (--metrics alone filters the tables)."""
    args, cfg = req.flags, req.config
    # flag: (stored key, this command's value, the flag's default)
    asked = {"--model": ("model", args.model, DEFAULT_MODEL)} | {
        flag: (key, getattr(cfg, key), getattr(DEFAULT, key)) for flag, key in STORED.items()}
    for path in req.paths:
        if not config_path(path).exists():
            continue
        stored = read_config(config_path(path))
        differ = stored_differences(stored, asked)
        ids = stored.get("samples")
        want = req.counts.get(results_report.dataset_of(path))
        if isinstance(ids, list) and req.samples_given and want is not None and want != len(ids):
            differ.append(f"--samples {len(ids)} (asked: {want})")
        note_ignored("--report-only", "summarises the stored results", path, differ,
                     " (--metrics alone filters the tables)")
    if args.no_resume:
        print("cwlens: note: --no-resume has no effect with --report-only (nothing is "
              "computed or deleted)", file=sys.stderr)
