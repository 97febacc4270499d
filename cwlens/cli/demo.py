"""``cwlens demo``: attention vs contribution on one GSM8K problem (the README's main job)."""

from cwlens.cli import arg_types
from cwlens.cli.common import add_model_args, load_handle
from cwlens.errors import InvalidArgumentError


def register(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="attention vs contribution for the most sink-heavy heads on one GSM8K problem",
        description="Runs the model on one GSM8K problem, prints for the most sink-heavy "
        "heads the top attended vs top contributing tokens and the factor split "
        "(attention x relative norm x cosine), and writes a figure (attention matrices "
        "above, contribution matrices below) as HTML and PNG.",
    )
    add_model_args(p)
    p.add_argument("--sample", type=arg_types.non_negative_int, default=0,
                   help="GSM8K sample index (default: 0)")
    p.add_argument("--max-tokens", type=arg_types.max_tokens, default=40,
                   help="truncate to this many tokens (default: 40)")
    p.add_argument("--heads", type=arg_types.positive_int, default=None,
                   help="how many sink-heavy heads to show, at most one per layer (default: 3)")
    p.add_argument("--out", default="runs/demo",
                   help="output folder (default: %(default)s; `--out figures` redraws the "
                   "README's figure, as `cwlens figures --only demo` does)")
    p.add_argument("--no-png", action="store_true", help="write HTML only (no Chromium needed)")
    p.set_defaults(func=run)


def run(args) -> int:
    from cwlens.datasets import load_dataset
    from cwlens.report.demo import run_demo

    n = len(load_dataset("gsm8k"))
    if args.sample >= n:
        raise InvalidArgumentError(f"--sample {args.sample}: the shipped GSM8K sample has "
                                   f"problems 0..{n - 1}")
    arg_types.output_dir(args.out)
    handle = load_handle(args)
    n_layers = handle.n_layers
    heads = args.heads or min(3, n_layers)
    if heads > n_layers:
        raise InvalidArgumentError(
            f"--heads {args.heads}: the demo shows at most one head per layer and the model "
            f"has {n_layers} layers; pass --heads {n_layers} or fewer"
        )
    run_demo(
        model_name=args.model, sample=args.sample, max_tokens=args.max_tokens,
        n_heads=heads, out_dir=args.out, png=not args.no_png,
        model=handle,
    )
    return 0
