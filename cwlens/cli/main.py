"""``cwlens``: one command, several subcommands. ``cwlens <subcommand> --help`` for each.

Exit codes: 0 success, 1 an error cwlens explains (bad input, missing model), 2 bad
command-line usage (argparse), 130 interrupted.
"""

import argparse
import sys

from cwlens.errors import CwlensError

EPILOG = """examples:
  cwlens demo                                   # the offline model on one GSM8K problem
  cwlens demo --model gpt2 --device cuda        # any TransformerLens-loadable model
models: a short name (smollm2-135m works offline), a local HF directory, or a hub id.
"""


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default="smollm2-135m",
        help="short name, local Hugging Face directory or hub id (default: %(default)s, offline)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: cuda if available)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cwlens",
        description="Contribution weights for TransformerLens models: where attention "
        "heads look vs what they move.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from cwlens import __version__

    parser.add_argument("--version", action="version", version=f"cwlens {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")

    demo = sub.add_parser(
        "demo",
        help="attention vs contribution for the most sink-heavy heads on one GSM8K problem",
        description="Runs the model on one GSM8K problem, prints for the most sink-heavy "
        "heads the top attended vs top contributing tokens and the factor split "
        "(attention x relative norm x cosine), and writes a figure (attention matrices "
        "above, contribution matrices below) as HTML and PNG.",
    )
    add_model_args(demo)
    demo.add_argument("--sample", type=int, default=0, help="GSM8K sample index (default: 0)")
    demo.add_argument("--max-tokens", type=int, default=40, help="truncate to this many tokens (default: 40)")
    demo.add_argument("--heads", type=int, default=3, help="how many sink-heavy heads to show (default: 3)")
    demo.add_argument("--out", default="figures", help="output folder (default: %(default)s)")
    demo.add_argument("--no-png", action="store_true", help="write HTML only (no Chromium needed)")
    demo.set_defaults(func=_run_demo)
    return parser


def _run_demo(args) -> int:
    from cwlens.demo import run_demo

    run_demo(
        model_name=args.model, sample=args.sample, max_tokens=args.max_tokens,
        n_heads=args.heads, out_dir=args.out, device=args.device, png=not args.no_png,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return args.func(args)
    except CwlensError as err:
        print(f"cwlens: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("cwlens: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
