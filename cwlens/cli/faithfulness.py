"""``cwlens faithfulness``: how faithful is each importance metric? (value masking)"""

import argparse
from pathlib import Path

from cwlens.cli.common import add_model_args
from cwlens.cli.placement import HELP as PLACEMENT_HELP
from cwlens.cli.placement import add_placement_args, load_kwargs

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

Rows are appended to <out>/<dataset>.jsonl as each sample finishes: rerun the same
command to resume after an interruption. At the end it prints a summary (mean and 95%
bootstrap CI per cell), writes figures/faithfulness_<dataset>.png/.html and, with
--summary-md, the results tables into a markdown file.
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


def register(sub) -> None:
    p = sub.add_parser(
        "faithfulness", help="comprehensiveness/sufficiency of importance metrics by value masking",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_args(p)
    add_placement_args(p)
    g = p.add_argument_group("data")
    g.add_argument("--dataset", default="gsm8k",
                   help="comma-separated: gsm8k, fineweb_edu, mmlu, winogrande, boolq (default: %(default)s)")
    g.add_argument("--samples", default="50",
                   help="samples per dataset: one number, or name=N,... (default: %(default)s)")
    g.add_argument("--num-fewshot", type=int, default=0, help="MMLU exemplars from the dev split, 0-5 (default: 0)")
    g.add_argument("--max-tokens", type=int, default=512,
                   help="truncate language-modelling documents to their first N tokens (default: %(default)s)")
    g = p.add_argument_group("masking protocol (defaults: see docs/faithfulness.md)")
    g.add_argument("--metrics", default="all", help="comma-separated metrics or 'all' (default: all six)")
    g.add_argument("--rates", default="0.1,0.3,0.5", help="removal rates in [0, 1] (default: %(default)s)")
    g.add_argument("--modes", default="comprehensiveness,sufficiency", help="(default: both)")
    g.add_argument("--scope", default="row", choices=("row", "head", "layer"),
                   help="ranking unit: per head-and-query row, per head, per layer (default: %(default)s)")
    g.add_argument("--layers", default="all", help="'all' or comma-separated layer indices (default: all)")
    g.add_argument("--per-layer", action="store_true", help="mask one layer at a time (n_layers x the cost)")
    g.add_argument("--kind", default="inter", choices=("inter", "intra"),
                   help="output that the value-aware metrics project on (default: %(default)s)")
    g.add_argument("--protect-first-token", action="store_true",
                   help="never mask the first token (BOS / attention sink); default: it may be masked")
    g.add_argument("--non-causal", action="store_true", help="let keys j > i count (encoders)")
    g.add_argument("--renormalize", action="store_true",
                   help="give removed attention mass back to the other keys (default: no)")
    g.add_argument("--seed", type=int, default=0, help="seed of the random control (default: 0)")
    g = p.add_argument_group("output")
    g.add_argument("--out", default="runs/faithfulness", help="results folder (default: %(default)s)")
    g.add_argument("--batch-tokens", type=int, default=2048, help="padded tokens per forward pass (default: %(default)s)")
    g.add_argument("--no-resume", action="store_true", help="start the results files afresh")
    g.add_argument("--report-only", action="store_true", help="do not run: summarise existing results")
    g.add_argument("--figures", default="figures", help="figure folder, '' for none (default: %(default)s)")
    g.add_argument("--no-png", action="store_true", help="figures as HTML only")
    g.add_argument("--summary-md", default=None,
                   help="write the results tables into these markdown files, comma-separated "
                   "(between <!-- faithfulness-results:start/end --> comments)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _samples(text: str, datasets: list[str]) -> dict[str, int]:
    if "=" not in text:
        return {d: int(text) for d in datasets}
    given = {k.strip(): int(v) for k, v in (kv.split("=") for kv in _csv(text))}
    missing = [d for d in datasets if d not in given]
    if missing:
        raise SystemExit(f"cwlens faithfulness: --samples has no count for {', '.join(missing)}")
    return given


def _config(args):
    from cwlens.faithfulness import RANKINGS, FaithfulnessConfig

    metrics = RANKINGS if args.metrics == "all" else tuple(_csv(args.metrics))
    layers = None if args.layers == "all" else tuple(int(x) for x in _csv(args.layers))
    return FaithfulnessConfig(
        metrics=metrics, rates=tuple(float(r) for r in _csv(args.rates)),
        modes=tuple(_csv(args.modes)), scope=args.scope, layers=layers,
        per_layer=args.per_layer, kind=args.kind, causal_only=not args.non_causal,
        mask_first_token=not args.protect_first_token, renormalize=args.renormalize,
        seed=args.seed, max_tokens=args.max_tokens, batch_tokens=args.batch_tokens,
    )


def run(args) -> int:
    from cwlens.datasets import available_datasets

    datasets = list(dict.fromkeys(_csv(args.dataset)))  # gsm8k,gsm8k runs it once
    known = {d.name: d for d in available_datasets()}
    for d in datasets:
        if d not in known:
            raise SystemExit(f"cwlens faithfulness: unknown dataset {d!r}; one of {', '.join(known)}")
    counts = _samples(args.samples, datasets)
    cfg = _config(args)
    out = Path(args.out)
    from cwlens import distributed

    if args.report_only:  # under torchrun, rank 0 alone reports
        env = distributed.launched()
        return report(_paths(out, datasets, args), args) if env is None or env.main else 0
    placed = load_kwargs(args)
    with distributed.session() as world:  # torchrun: one process group for the command
        from cwlens.results_io import results_lock

        with results_lock(out):  # one run per results folder (torchrun: per job)
            return _run(args, out, datasets, counts, cfg, placed, world)


def _paths(out, datasets, args) -> list[Path]:
    return [out / f"{d}{f'_{s}shot' if (s := _shots(d, args)) else ''}.jsonl" for d in datasets]


def _shots(dataset: str, args) -> int:
    return args.num_fewshot if dataset == "mmlu" else 0


def _run(args, out, datasets, counts, cfg, placed, world) -> int:
    paths = _paths(out, datasets, args)
    model = None
    for d, path in zip(datasets, paths, strict=True):
        shots = _shots(d, args)
        if model is None:
            import cwlens

            model = cwlens.load_model(args.model, **placed)
        from cwlens.faithfulness import run_faithfulness

        result = run_faithfulness(
            model, d, cfg, n=counts[d], num_fewshot=shots, out=path, resume=not args.no_resume,
            model_name=args.model, progress=not args.no_progress,
        )
        s = result.stats
        if world.main:
            ranks = f" over {world.size} processes" if world.size > 1 else ""
            print(f"{d}: {s.n_forwards} forward passes in {s.n_batches} batches{ranks}, "
                  f"{s.wall_seconds:.0f}s -> {path}")
    return report(paths, args) if world.main else 0


def report(paths, args) -> int:
    from cwlens.faithfulness import read_results, summarize
    from cwlens.faithfulness.report import main_measure, markdown_tables, write_block

    table = read_results(paths)
    summary = summarize(table)
    text = markdown_tables(summary, table)
    print(text)
    for path in filter(None, (args.summary_md or "").split(",")):
        write_block(path, text)
        print(f"tables written to {path}")
    if args.figures:
        from cwlens.faithfulness.report import setting_groups
        from cwlens.plotting import save_figure
        from cwlens.plotting.faithfulness import faithfulness_curves

        for ds in sorted(summary.dataset.unique()):
            for suffix, model, rows in setting_groups(summary, ds):
                fig = faithfulness_curves(rows, ds, main_measure(summary, ds),
                                          title=f"{ds} — {model or args.model} (value masking)")
                written = save_figure(fig, Path(args.figures) / f"faithfulness_{ds}{suffix}",
                                      png=not args.no_png)
                print("figure:", ", ".join(map(str, written)))
    return 0

