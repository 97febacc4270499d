"""``cwlens faithfulness``: how faithful is each importance metric? (value masking)"""

import argparse
from pathlib import Path

from cwlens.cli import arg_types
from cwlens.cli.accuracy import PROMPTS
from cwlens.cli.common import (
    add_figures_flag,
    add_model_args,
    add_past_context_flag,
    add_progress_flag,
    figures_dir,
    load_model,
)
from cwlens.cli.placement import HELP as PLACEMENT_HELP
from cwlens.cli.placement import add_placement_args, load_kwargs
from cwlens.core.metrics import KINDS
from cwlens.errors import InvalidArgumentError
from cwlens.faithfulness.config import RANKING_PATHS, FaithfulnessConfig
from cwlens.faithfulness.ranking import ALL_RANKINGS, MODES, RANKINGS, SCOPES

DEFAULT = FaithfulnessConfig()  # the flags' defaults are the configuration's

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


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _metrics_help() -> str:
    from cwlens.core import metrics

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


def _samples(spec: int | dict[str, int], datasets: tuple[str, ...]) -> dict[str, int]:
    if isinstance(spec, int):
        return {d: spec for d in datasets}
    missing = [d for d in datasets if d not in spec]
    if missing:
        raise InvalidArgumentError(
            f"--samples has no count for {', '.join(missing)}; give one for each --dataset, "
            "e.g. " + ",".join(f"{d}=50" for d in datasets)
        )
    extra = [d for d in spec if d not in datasets]
    if extra:
        raise InvalidArgumentError(
            f"--samples gives a count for {', '.join(extra)}, which --dataset "
            f"({','.join(datasets)}) does not list"
        )
    return dict(spec)


def _config(args):
    return FaithfulnessConfig(
        metrics=args.metrics or RANKINGS, rates=args.rates, modes=args.modes, scope=args.scope,
        layers=args.layers, per_layer=args.per_layer, kind=args.kind,
        causal_only=not args.non_causal, mask_first_token=not args.protect_first_token,
        renormalize=args.renormalize, seed=args.seed, max_tokens=args.max_tokens,
        batch_tokens=args.batch_tokens, past_context=args.past_context,
        prepend_bos=not args.no_bos, ranking_path=args.ranking_path,
    )


def _prompt(args, dataset: str) -> str:
    """The prompt ``dataset`` is scored with: chat only where it has a chat form."""
    from cwlens.cli.accuracy import prompt_of

    return prompt_of(dataset, args.prompt)


def _source(args, model, dataset: str, n: int):
    """What run_faithfulness and the chance check score: the dataset's name, or under
    ``--prompt chat`` its chat items (``cwlens.datasets.chat_prompts``)."""
    if _prompt(args, dataset) != "chat":
        return dataset
    from cwlens.datasets import load_dataset
    from cwlens.engine.handle import wrap

    return load_dataset(dataset, n=n, chat=wrap(model).chat_prompt)


def _check_inputs(args, datasets: tuple[str, ...], counts: dict[str, int]) -> list[Path]:
    """Everything that can be checked without the model: counts, paths. Returns the
    results files."""
    from cwlens.datasets import load_dataset

    out = arg_types.output_dir(args.out, must_write=False)
    paths = []
    for d in datasets:
        shots = args.num_fewshot if d == "mmlu" else 0
        if not args.report_only and args.file is None:
            load_dataset(d, n=counts[d], num_fewshot=shots)  # too many samples: fails here
        chat = "_chat" if _prompt(args, d) == "chat" else ""
        paths.append(_results_path(out, f"{d}{f'_{shots}shot' if shots else ''}{chat}",
                                   args.compress, fresh=args.no_resume and not args.report_only))
    if args.report_only:
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            from cwlens.faithfulness.results import split_name

            there = sorted({split_name(p)[0] for p in [*out.glob("*.jsonl"), *out.glob("*.jsonl.gz")]
                            if ".shard-" not in p.name}) if out.is_dir() else []
            hint = (f"; {out} holds results of {', '.join(there)}: pass --dataset (or, for "
                    "file_<name>, the same --file)" if there else "")
            raise InvalidArgumentError(
                f"--report-only: no results in {', '.join(missing)}; run without --report-only "
                f"first, or pass the --out of that run{hint}"
            )
    elif args.no_resume or not all(p.is_file() for p in paths):
        arg_types.output_dir(out)  # something will be written: it must be writable now
    if args.figures:
        arg_types.output_dir(args.figures, "--figures")
    from cwlens.faithfulness.report import check_block

    for md in _csv(args.summary_md or ""):
        arg_types.markdown_file(md, "--summary-md")
        check_block(md)
        check_block(md, AOPC_START, AOPC_END)
    return paths


def _results_path(out: Path, name: str, compress: bool, fresh: bool = False) -> Path:
    """``<out>/<name>.jsonl``, or ``.jsonl.gz`` under --compress or where only that exists
    (``fresh``, --no-resume: the writer deletes both, so either may be there)."""
    plain, packed = out / f"{name}.jsonl", out / f"{name}.jsonl.gz"
    if fresh:
        return packed if compress else plain
    if plain.is_file() and packed.is_file():
        raise InvalidArgumentError(
            f"{out} holds both {plain.name} and {packed.name}: keep one (gzip the plain file "
            f"into the other with 'gzip -c {plain} >> {packed}', then delete it) and rerun")
    if compress and plain.is_file():
        raise InvalidArgumentError(
            f"--compress: {plain} holds this run's rows uncompressed; compress it first "
            f"('gzip {plain}', which resumes as {packed.name}) or leave out --compress")
    return packed if compress or packed.is_file() else plain


def _file_dataset(path: str) -> str:
    """The dataset name of a ``--file`` run: ``file_<file name>`` (``file_stdin`` for -)."""
    import re

    stem = "stdin" if path == "-" else Path(path).stem
    return "file_" + (re.sub(r"[^A-Za-z0-9_.-]+", "_", stem) or "text")


def _file_samples(args) -> list:
    """``--file``: the file as one :class:`~cwlens.datasets.TextSample`."""
    from cwlens.datasets import TextSample
    from cwlens.errors import EmptyInputError

    text = arg_types.read_text(args.file)
    if not text.strip():
        raise EmptyInputError(f"--file {args.file}: the text is empty; pass a non-empty text file")
    import hashlib

    name = _file_dataset(args.file)  # the id carries the text's hash: another text under
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]  # the same name is refused
    return [TextSample(f"{name}-{digest}", text, name)]


def _note_unused_flags(args, datasets) -> None:
    """A note (stderr) for a flag this run does not use, so nobody reads its absence into
    the numbers: --require-above-chance and --prompt chat act on multiple-choice datasets
    (chat: those with a chat form) only."""
    import sys

    from cwlens.datasets.chat_prompts import CHAT_DATASETS
    from cwlens.datasets.registry import SPECS

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
    args.samples_given = args.samples is not None
    args.figures = figures_dir(args)
    if args.file is not None:
        if args.samples_given:
            raise InvalidArgumentError("--samples applies to --dataset only: --file scores its "
                                       "text as one document; drop --samples")
        args.samples = 1  # one document
        args.file_samples = _file_samples(args)
        args.dataset = (_file_dataset(args.file),)
    elif args.samples is None:
        args.samples = 50
    datasets = args.dataset
    counts = _samples(args.samples, datasets)
    if args.num_fewshot and "mmlu" not in datasets:
        raise InvalidArgumentError("--num-fewshot applies to mmlu only, and --dataset has no mmlu")
    if args.num_fewshot and args.prompt == "chat":
        raise InvalidArgumentError("--prompt chat is zero-shot: leave out --num-fewshot, or use "
                                   "--prompt plain for MMLU with exemplars")
    cfg = _config(args)
    paths = _check_inputs(args, datasets, counts)
    _note_unused_flags(args, datasets)
    from cwlens.runs import distributed

    if args.report_only:  # under torchrun, rank 0 alone reports
        env = distributed.launched()
        return report(paths, args) if env is None or env.main else 0
    placed = load_kwargs(args)
    with distributed.session() as world:  # torchrun: one process group for the command
        from cwlens.runs.results_io import results_lock

        with results_lock(paths[0].parent):  # one run per results folder (torchrun: per job)
            return _run(args, datasets, counts, cfg, paths, placed, world)


def _run(args, datasets, counts, cfg, paths, placed, world) -> int:
    model = None
    for d, path in zip(datasets, paths, strict=True):
        if model is None:

            model = load_model(args, **placed)
            if cfg.layers is not None:  # before any compute
                from cwlens.engine.adapter import resolve_layers

                resolve_layers(model, list(cfg.layers))
        from cwlens.faithfulness import run_faithfulness

        shots = args.num_fewshot if d == "mmlu" else 0
        source = args.file_samples if args.file is not None else _source(args, model, d, counts[d])
        if args.require_above_chance and args.file is None:
            _check_chance(model, source, counts[d], shots, cfg, world,
                          path if not args.no_resume else None, args)
        result = run_faithfulness(
            model, source, cfg, n=counts[d], num_fewshot=shots, out=path, resume=not args.no_resume,
            model_name=args.model, progress=not args.no_progress,
        )
        s = result.stats
        if world.main:
            ranks = f" over {world.size} processes" if world.size > 1 else ""
            print(f"{d}: {s.n_forwards} forward passes in {s.n_batches} batches{ranks}, "
                  f"{s.wall_seconds:.0f}s -> {path}")
            from cwlens.engine.handle import wrap
            from cwlens.faithfulness.passes import sharing_note

            print(f"  {sharing_note(cfg.conditions(wrap(model).n_layers), cfg)}")
    return report(paths, args) if world.main else 0


def _check_chance(model, dataset, n, shots, cfg, world, path, args) -> None:
    """A multiple-choice dataset (a name, or its items): its clean accuracy must clear
    chance (else AtChanceError). Resuming ``path`` (None: not resumed), the items it
    already holds are read from their clean rows, not run again. ``args``: the command's
    options (``--model`` names the rows, ``--no-progress`` hides the bar)."""
    model_name, progress = args.model, not args.no_progress
    from cwlens.datasets import ChoiceItem, load_dataset
    from cwlens.faithfulness.accuracy import (
        clean_accuracy,
        require_above_chance,
        written_accuracies,
    )

    items = load_dataset(dataset, n=n, num_fewshot=shots) if isinstance(dataset, str) else dataset
    if not items or not isinstance(items[0], ChoiceItem):
        return
    known = written_accuracies(model, items, cfg, path, model_name=model_name, num_fewshot=shots)
    from cwlens.runs.progress import bar

    left = sum(1 for item in items if item.id not in known)
    with bar(left, f"{items[0].dataset}: clean accuracy", "item",
             enabled=progress and world.main, ticks=True):
        check = clean_accuracy(model, items, batch_tokens=cfg.batch_tokens, known=known,
                               prepend_bos=cfg.prepend_bos)
    if world.main:
        read = f" ({check.reused} of them read from {path})" if check.reused else ""
        print(f"clean accuracy: {check.line()}{read}", flush=True)
    require_above_chance(check)


def report(paths, args) -> int:
    from cwlens.faithfulness import read_results, summarize
    from cwlens.faithfulness.report import has_block, main_measure, markdown_tables, write_block
    from cwlens.faithfulness.results import partial_samples

    table = read_results(paths)
    torn = partial_samples(table)  # a write cut mid-sample: left out, as a resume would
    table = table[~table.sample_id.isin(torn)]
    if table.empty:
        raise InvalidArgumentError(
            f"no complete result rows in {', '.join(map(str, paths))} (a run stopped before "
            "its first sample was written): run without --report-only to compute them")
    if args.metrics is not None and args.report_only:  # the tables of these metrics only
        held = sorted(set(table.metric) - {"none"})
        absent = [m for m in args.metrics if m not in held]
        if absent:
            raise InvalidArgumentError(
                f"--report-only --metrics: no rows of {', '.join(absent)} in "
                f"{', '.join(map(str, paths))}; it holds {', '.join(held)}. Leave --metrics "
                "out for all of them, or run without --report-only to compute the missing ones")
        table = table[table.metric.isin({*args.metrics, "none"})]
        print(f"(tables limited to --metrics {','.join(args.metrics)})")
    summary = summarize(table)
    text = markdown_tables(summary, table)
    unfinished = _unfinished(paths, table, args.metrics if args.report_only else None)
    if torn:
        unfinished.append(
            f"**Unfinished run**: {len(torn)} sample(s) only partly written ({', '.join(torn[:5])}"
            f"{', ...' if len(torn) > 5 else ''}) are left out of these tables; rerun the same "
            "command without --report-only to compute them.")
    if args.report_only:
        _note_stored_config(paths, args)
    if unfinished:
        text = "\n".join(unfinished) + "\n\n" + text
    print(text)
    for path in filter(None, (args.summary_md or "").split(",")):
        write_block(path, text)
        print(f"tables written to {path}")
    if args.figures:
        from cwlens.faithfulness.report import masked_layers, setting_groups
        from cwlens.plotting import save_figure
        from cwlens.plotting.faithfulness import faithfulness_curves

        for ds in sorted(summary.dataset.unique()):
            for suffix, model, rows in setting_groups(summary, ds):
                subset = sorted({x for x in rows.get("layers", []) if masked_layers(x)})
                where = f", layers {' / '.join(subset)}" if subset else ""
                fig = faithfulness_curves(rows, ds, main_measure(summary, ds),
                                          title=f"{ds} — {model or args.model} (value masking{where})")
                written = save_figure(fig, Path(args.figures) / f"faithfulness_{ds}{suffix}",
                                      png=not args.no_png)
                print("figure:", ", ".join(map(str, written)))
    aopc_text = _aopc_report(table, args)
    for path in filter(None, (args.summary_md or "").split(",")):
        if aopc_text:
            write_block(path, aopc_text, AOPC_START, AOPC_END)
            print(f"AOPC tables written to {path}")
        elif has_block(path, AOPC_START):  # an earlier run's AOPC would sit under new tables
            write_block(path, "No AOPC: these results have fewer than three masking rates.",
                        AOPC_START, AOPC_END)
            print(f"AOPC block in {path} cleared (fewer than three rates)")
    return 0


def _unfinished(paths, table, only=None) -> list[str]:
    """One line per results file whose stored configuration has more samples (or a
    metric on fewer samples) than its rows: the tables show an unfinished run."""
    from cwlens.faithfulness import read_results
    from cwlens.faithfulness.results import config_path, read_config

    lines = []
    for path in paths:
        cfg_file = config_path(path)
        if not cfg_file.exists():
            continue
        cfg = read_config(cfg_file)
        want = cfg.get("samples")
        if not isinstance(want, list) or not want:
            continue
        if len(paths) == 1:
            rows = table
        else:
            from cwlens.faithfulness.results import partial_samples

            rows = read_results(path)
            rows = rows[~rows.sample_id.isin(partial_samples(rows))]
        have = set(rows.sample_id)
        metrics = [m for m in cfg.get("metrics", []) if only is None or m in only]
        short = [f"{m}: {len(set(rows.sample_id[rows.metric == m]))}" for m in metrics
                 if len(set(rows.sample_id[rows.metric == m])) < len(have)]
        if len(have) < len(want) or short:
            lines.append(f"**Unfinished run**: {path} holds {len(have)} of the {len(want)} samples of "
                         "its configuration" + (f" (samples per metric: {', '.join(short)})" if short else "")
                         + "; rerun the same command without --report-only to finish it.")
    return lines


def _note_stored_config(paths, args) -> None:
    """--report-only summarises the stored rows as they are: a note (stderr) for each
    flag given another value than its default and than the stored run's, which the
    report therefore does not follow (--metrics alone filters the tables)."""
    import sys

    from cwlens.cli.common import DEFAULT_MODEL, note_ignored, stored_differences
    from cwlens.faithfulness.results import config_path, read_config

    cfg = _config(args)
    asked = {  # flag: (stored key, this command's value, the flag's default)
        "--model": ("model", args.model, DEFAULT_MODEL),
        "--rates": ("rates", cfg.rates, DEFAULT.rates),
        "--modes": ("modes", cfg.modes, DEFAULT.modes),
        "--scope": ("scope", cfg.scope, DEFAULT.scope),
        "--kind": ("kind", cfg.kind, DEFAULT.kind),
        "--layers": ("layers", cfg.layers, None),
        "--per-layer": ("per_layer", cfg.per_layer, False),
        "--non-causal": ("causal_only", cfg.causal_only, True),
        "--protect-first-token": ("mask_first_token", cfg.mask_first_token, True),
        "--renormalize": ("renormalize", cfg.renormalize, False),
        "--seed": ("seed", cfg.seed, DEFAULT.seed),
        "--max-tokens": ("max_tokens", cfg.max_tokens, DEFAULT.max_tokens),
        "--past-context": ("past_context", cfg.past_context, DEFAULT.past_context),
    }
    counts = args.samples if isinstance(args.samples, dict) else None
    for path in paths:
        if not config_path(path).exists():
            continue
        stored = read_config(config_path(path))
        differ = stored_differences(stored, asked)
        ids = stored.get("samples")
        want = counts.get(split_name_dataset(path)) if counts else args.samples
        if isinstance(ids, list) and args.samples_given and want is not None and want != len(ids):
            differ.append(f"--samples {len(ids)} (asked: {want})")
        note_ignored("--report-only", "summarises the stored results", path, differ,
                     " (--metrics alone filters the tables)")
    if args.no_resume:
        print("cwlens: note: --no-resume has no effect with --report-only (nothing is "
              "computed or deleted)", file=sys.stderr)


def split_name_dataset(path) -> str:
    """The dataset a results file holds (``mmlu`` for ``mmlu_5shot_chat.jsonl.gz``)."""
    from cwlens.faithfulness.results import split_name

    base = split_name(path)[0].removesuffix("_chat")
    return base.split("_", 1)[0] if "shot" in base else base


AOPC_START, AOPC_END = "<!-- faithfulness-aopc:start -->", "<!-- faithfulness-aopc:end -->"


def _aopc_report(table, args) -> str:
    """With three or more rates: the AOPC table (ΔNLL for language modelling, accuracy for
    multiple choice) per dataset and setting, and its perturbation-curve figure. Prints the
    tables and returns their text ("" with fewer rates)."""
    from cwlens.faithfulness import aopc
    from cwlens.faithfulness.report import setting_groups

    blocks: list[str] = []

    def emit(*parts: str) -> None:
        for part in parts:
            print(part)
        blocks.extend(parts)

    for ds in sorted(table.dataset.unique()):
        for suffix, model, rows in setting_groups(table, ds):
            if rows["rate"][rows["mode"] != "clean"].nunique() < 3:
                continue
            measure = "delta_nll" if (rows.measure == "nll").any() else "acc"
            damage = aopc.damages(rows, measure)
            summary = None
            for param in aopc.PARAMETERISATIONS:  # each table names its bins
                try:
                    per_sample = aopc.aopc_bins(damage, param)
                except aopc.InvalidArgumentError:  # none of these bins among the run's rates
                    continue
                bins = dict(zip(per_sample["mode"], per_sample["bins"], strict=True))
                table_ = aopc.aopc_summary(per_sample)
                summary = table_ if summary is None else summary
                emit(f"**{ds}**{f' ({model})' if model else ''}: area over the perturbation curve",
                     aopc.markdown(table_, measure, aopc.verdicts(per_sample),
                                   parameterisation=param, bins_used=bins))
            if summary is None:  # no ERASER bin: every rate of the run, as removed fractions
                per_sample = aopc.aopc(damage)
                summary = aopc.aopc_summary(per_sample)
                emit(f"**{ds}**{f' ({model})' if model else ''}: area over the perturbation "
                     "curve (bins = the run's rates, fraction removed)",
                     aopc.markdown(summary, measure, aopc.verdicts(per_sample)))
            if args.figures:
                from cwlens.plotting import save_figure
                from cwlens.plotting.faithfulness import aopc_curves

                fig = aopc_curves(aopc.curve_summary(damage), summary,
                                  f"{ds} — {model or args.model}", aopc.UNITS[measure])
                written = save_figure(fig, Path(args.figures) / f"faithfulness_{ds}{suffix}_aopc",
                                      png=not args.no_png)
                print("figure:", ", ".join(map(str, written)))
    return "\n".join(blocks)

