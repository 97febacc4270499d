"""``cwlens groundtruth``: every importance method scored against compiled transformers
whose computation is known (tracr programs), per level: the heads' movement, the input
dependence, the compiled graph's components."""

import argparse
from pathlib import Path

from cwlens.cli import arg_types
from cwlens.cli.common import add_debug_flag, add_figures_flag, add_progress_flag, figures_dir

DESCRIPTION = """\
Runs each program's inputs (its own sampler, seeded) through a float64 copy of its
compiled model and scores every cwlens importance method against the program's ground
truth, never the network's: the layer metrics (attention, value-weighted, contribution
intra/inter, |contribution|, ALTI, attention x gradient, ...) against the (query, key)
pairs each head moves a value along; attention rollout, the token flows and captum's
saliency / input x gradient / integrated gradients against the input tokens each output
depends on; contribution share, direct logit attribution and activation patching against
the heads of the compiled graph. Per program and method: the mean per-input ROC AUC and
precision at |truth| with 95% bootstrap-t intervals over inputs, and the difference from
the level's attention-based reference resolved by Holm's correction (docs/groundtruth.md).
Writes per_input.csv.gz, summary.csv and tables.md under --out, the figure (HTML + PNG)
under --figures and, with --json, the scores of each program.

tracr's zero-weight padding heads are in no score. A program whose compiled network's
output differs from the RASP program's on an input (where the program has an output) is
refused, naming the input. Rows whose attention output is at most 1e-3 of the layer's
largest projected value norm (a query that fell back to a value-less BOS writes only the
softmax's leak) get 0 from the measures normalised by that output, as cwlens does where
||o|| = 0 (--silent-row-threshold; --json: "silent_row_threshold"; docs/groundtruth.md,
"Numbers"). A program file's max_seq_len is at most 32 (larger ones are refused before
tracr compiles them)."""

EPILOG = """\
examples:
  cwlens groundtruth                                  # every shipped program, 256 inputs each
  cwlens groundtruth --program frac_prevs,reverse --inputs 50
  cwlens groundtruth --program my_program.py         # a RASP file: program, vocab, max_seq_len
  cwlens groundtruth --json scores.json
  cwlens groundtruth --out results/groundtruth --figures figures --summary-md docs/groundtruth.md
--json FILE holds {"program", "n_inputs", "output_mismatches", "n_inputs_scored": {level: n},
"silent_row_threshold", "methods": {method: {"level", "auroc", "ci", "precision_at_truth",
"n_inputs_scored"}}} for one program, a list of such objects for several. n_inputs: the
inputs drawn and run; n_inputs_scored: those a level's means are over (an input with no
positive or no negative entry at a level has no AUROC there).
"""


def shipped_names() -> list[str]:
    """The shipped programs' names, from their files (cheap: nothing imported)."""
    folder = Path(__file__).resolve().parents[1] / "groundtruth" / "programs"
    return sorted(p.stem for p in folder.glob("*.json"))


def program_list(text: str) -> list[str]:
    """``--program``: comma-separated shipped names, or one path to a ``.py`` file."""
    from cwlens.groundtruth.library import names

    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise argparse.ArgumentTypeError(
            f"expected shipped program names, comma-separated, or a .py file; got {text!r}")
    if len(items) == 1 and items[0].endswith(".py"):
        if not Path(items[0]).is_file():
            raise argparse.ArgumentTypeError(
                f"no program file {items[0]!r}: pass a Python file that defines program, vocab and "
                "max_seq_len, or a shipped program's name")
        return items
    shipped = names()
    unknown = [t for t in items if t not in shipped]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown program {unknown[0]!r}: the shipped ones are {', '.join(shipped)}; a "
            "program of your own is a .py file (needs the tracr extra)")
    if len(set(items)) < len(items):
        raise argparse.ArgumentTypeError(f"a program is listed twice in {text!r}: give each once")
    return items


def silent_threshold(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(
            f"must be a number in [0, 1) (the silent-row threshold; 1e-3 by default, 0 for "
            f"none); got {text!r}")
    return value


def at_least_three(text: str) -> int:
    value = arg_types.positive_int(text)
    if value < 3:
        raise argparse.ArgumentTypeError(
            f"must be at least 3 (the bootstrap intervals need three inputs); got {value}")
    return value


def register(sub) -> None:
    p = sub.add_parser(
        "groundtruth", help="every importance method scored against compiled (tracr) ground truth",
        description=DESCRIPTION,
        epilog=f"shipped programs: {', '.join(shipped_names())}\n\n{EPILOG}", formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_debug_flag(p, argparse.SUPPRESS)
    p.add_argument("--program", type=program_list, default=None,
                   help="shipped programs, comma-separated (default: all: "
                   f"{', '.join(shipped_names())}), or a .py file defining program, vocab, "
                   "max_seq_len and optionally sample_inputs (needs the tracr extra)")
    p.add_argument("--inputs", type=at_least_three, default=256,
                   help="random inputs per program (default: %(default)s; the shipped truth covers "
                   "the first 256 of seed 0, others need tracr)")
    p.add_argument("--seed", type=arg_types.non_negative_int, default=0,
                   help="seed of the inputs (default: %(default)s)")
    p.add_argument("--silent-row-threshold", type=silent_threshold, default=1e-3, metavar="X",
                   help="a row whose attention output ||o|| is at most X times the layer's largest "
                   "||v~|| gets 0 from the output-normalised measures (contribution, its "
                   "|.|, vw output-norm., ALTI of the attention output, contribution share); "
                   "0: only rows with ||o|| = 0 (default: %(default)s)")
    p.add_argument("--bootstrap", type=arg_types.positive_int, default=1999,
                   help="bootstrap resamples of the intervals (default: %(default)s)")
    p.add_argument("--out", default="runs/groundtruth",
                   help="folder for per_input.csv.gz, summary.csv, tables.md (default: %(default)s)")
    add_figures_flag(p, "figure")
    p.add_argument("--no-png", action="store_true", help="write HTML only (no Chromium needed)")
    p.add_argument("--json", default=None, metavar="FILE",
                   help="write each program's scores as JSON (see the epilog)")
    p.add_argument("--summary-md", default=None, type=arg_types.markdown_list,
                   help="write the tables into these markdown files, comma-separated "
                   "(between <!-- groundtruth-scores:start/end --> comments)")
    add_progress_flag(p)
    from cwlens.cli.groundtruth_edges import EDGE_EPILOG, add_edge_args

    add_edge_args(p)
    p.epilog = f"{p.epilog}\n{EDGE_EPILOG}"
    p.set_defaults(func=run)


def _programs(args) -> list:
    from cwlens.groundtruth import library

    chosen = args.program or library.names()
    if len(chosen) == 1 and chosen[0].endswith(".py"):
        return [library.from_file(chosen[0])]
    return [library.load(name) for name in chosen]


def _command(args) -> str:
    parts = ["cwlens groundtruth"]
    if args.program:
        parts.append(f"--program {','.join(args.program)}")
    for flag, value, default in (("--inputs", args.inputs, 256), ("--seed", args.seed, 0),
                                 ("--silent-row-threshold", args.silent_row_threshold, 1e-3),
                                 ("--bootstrap", args.bootstrap, 1999)):
        if value != default:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


def run(args) -> int:
    if args.edges:
        from cwlens.cli import groundtruth_edges

        return groundtruth_edges.run(args)

    from cwlens.faithfulness.report import check_block, write_block
    from cwlens.groundtruth import report
    from cwlens.groundtruth.evaluate import score_program
    from cwlens.groundtruth.methods import METHODS

    out = arg_types.output_dir(args.out)
    figures = figures_dir(args)  # '': none
    figures_out = arg_types.output_dir(figures, "--figures") if figures else None
    json_path = arg_types.output_file(args.json, "--json", "scores.json") if args.json else None
    md = [arg_types.markdown_file(p, "--summary-md") for p in (args.summary_md or "").split(",") if p]
    for path in md:
        check_block(path, report.START, report.END)
    from cwlens.groundtruth.input_scores import require_captum

    require_captum()  # before any program compiles or runs
    programs = _programs(args)
    progress = not args.no_progress  # drawn on stderr when it is a terminal (cwlens.runs.progress)
    results = []
    for program in programs:
        handle = program.handle
        print(f"cwlens groundtruth: {program.name} ({handle.n_layers} layers x {handle.n_heads} "
              f"heads), {args.inputs} inputs", flush=True)
        results.append(score_program(program, args.inputs, args.seed, progress=progress,
                                     n_boot=args.bootstrap, zero_output=args.silent_row_threshold))
    import pandas as pd

    summary = pd.concat([r.summary for r in results], ignore_index=True)
    text = report.markdown(summary, args.inputs, args.seed, _command(args))
    print()
    print(text)
    written = report.write_run(results, out)
    (out / "tables.md").write_text(text)
    written.append(out / "tables.md")
    if json_path is not None:
        written.append(report.write_json(results, json_path))
    if figures_out is not None:
        from cwlens.plotting.export import save_figure
        from cwlens.plotting.groundtruth import auroc_figure

        source = (f"{len(results)} compiled programs ({', '.join(r.program for r in results)}), "
                  f"{args.inputs} inputs each, seed {args.seed}; {_command(args)}")
        fig = auroc_figure(summary, {m.name: m.label for m in METHODS}, source)
        written += save_figure(fig, figures_out / "groundtruth_auroc", png=not args.no_png)
    for path in md:
        write_block(path, text, report.START, report.END)
        written.append(path)
    print("wrote " + ", ".join(str(p) for p in written))
    return 0
