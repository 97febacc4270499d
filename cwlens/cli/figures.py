"""``cwlens figures``: regenerate every figure in ``figures/`` from the offline model.

It runs the other subcommands with the settings the figures in ``figures/`` were made with.
The faithfulness and sink runs keep their results in ``runs/`` and resume, so a second
call only redraws (or finishes an interrupted run).
"""

from cwlens.cli import arg_types
from cwlens.cli.common import add_model_args

FAITHFULNESS = [
    "--dataset", "gsm8k,fineweb_edu,mmlu,winogrande,boolq",
    "--samples", "gsm8k=50,fineweb_edu=50,mmlu=100,winogrande=100,boolq=100",
    "--max-tokens", "128", "--rates", "0.3",
    "--metrics", "attention,value_weighted,value_weighted_output_normalized,contribution,random",
    "--out", "runs/faithfulness", "--summary-md", "docs/faithfulness.md",
]
RATES = [
    "--dataset", "gsm8k", "--samples", "gsm8k=50", "--max-tokens", "128", "--rates", "0.1,0.3,0.5",
    "--metrics", "attention,value_weighted,contribution,contribution_abs,random",
    "--out", "runs/faithfulness_curves", "--summary-md", "docs/faithfulness_curves.md",
]
SINKS = ["--dataset", "gsm8k", "--samples", "50", "--max-tokens", "128", "--out", "runs/sinks"]
STEPS = ("demo", "sinks", "faithfulness", "rates")
# Both runs keep their results in runs/: the faithfulness sweep resumes sample by sample;
# the sink tables, once written, are only redrawn (--rerun recomputes them).


def register(sub) -> None:
    p = sub.add_parser(
        "figures",
        help="regenerate every figure in figures/ (demo, sinks, faithfulness, rates)",
        description="Runs `cwlens demo`, `cwlens sinks` and `cwlens faithfulness` (all five "
        "datasets at 30% removal, and GSM8K at 10/30/50% for the curves in --out/rates) with the "
        "settings behind the figures in figures/ and writes HTML + PNG to --out, and the "
        "faithfulness tables into docs/faithfulness.md and docs/faithfulness_curves.md: the "
        "one command that rewrites the repository's figures (the others write into runs/ "
        "unless a flag names figures/). The sink and "
        "faithfulness results live in runs/ and resume: the first call takes long on a CPU "
        "(the faithfulness sweep about an hour on 2 cores), later calls only redraw.",
    )
    add_model_args(p)
    p.add_argument("--out", default="figures", help="figure folder (default: %(default)s)")
    p.add_argument("--only", default=",".join(STEPS), type=arg_types.choice_list(STEPS, "step"),
                   help="comma-separated steps to run (default: %(default)s)")
    p.add_argument("--no-png", action="store_true", help="HTML only (no Chromium needed)")
    p.add_argument("--rerun", action="store_true",
                   help="recompute the sink tables even if runs/sinks has them (the faithfulness "
                   "run always resumes: delete runs/faithfulness to start it afresh)")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from cwlens.cli.main import main as cwlens_main

    steps = list(args.only)
    arg_types.output_dir(args.out)
    common = ["--model", args.model] + (["--device", args.device] if args.device else [])
    common += ["--debug"] if getattr(args, "debug", False) else []
    sinks_done = Path(SINKS[SINKS.index("--out") + 1], "summary.json").is_file()
    redraw = ["--plot-only"] if sinks_done and not args.rerun else []
    png = ["--no-png"] if args.no_png else []
    argv = {
        "demo": ["demo", *common, "--out", args.out, *png],
        "sinks": ["sinks", *common, *SINKS, "--figures", args.out, *png, *redraw],
        "faithfulness": ["faithfulness", *common, *FAITHFULNESS, "--figures", args.out, *png],
        "rates": ["faithfulness", *common, *RATES, "--figures", f"{args.out}/rates", *png],
    }
    for i, step in enumerate(steps, 1):
        print(f"\n== [{i}/{len(steps)}] cwlens {' '.join(argv[step])}", flush=True)
        code = cwlens_main(argv[step])
        if code:
            return code
    return 0
