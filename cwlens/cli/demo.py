"""``cwlens demo``: attention vs contribution on one GSM8K problem (the README's main job)."""

from cwlens.cli.common import add_model_args


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
    p.add_argument("--sample", type=int, default=0, help="GSM8K sample index (default: 0)")
    p.add_argument("--max-tokens", type=int, default=40, help="truncate to this many tokens (default: 40)")
    p.add_argument("--heads", type=int, default=3, help="how many sink-heavy heads to show (default: 3)")
    p.add_argument("--out", default="figures", help="output folder (default: %(default)s)")
    p.add_argument("--no-png", action="store_true", help="write HTML only (no Chromium needed)")
    p.set_defaults(func=run)


def run(args) -> int:
    from cwlens.demo import run_demo

    run_demo(
        model_name=args.model, sample=args.sample, max_tokens=args.max_tokens,
        n_heads=args.heads, out_dir=args.out, device=args.device, png=not args.no_png,
    )
    return 0
