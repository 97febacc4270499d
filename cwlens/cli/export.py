"""``cwlens export``: streamed reductions of texts as tidy Parquet (or CSV) tables."""

import sys
from pathlib import Path

from cwlens.cli.common import add_model_args
from cwlens.errors import CwlensError


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="per-row top-k, column sums, head summaries (and token-level matrices) as Parquet",
        description="Runs the streaming engine on each text and writes tidy tables, one row "
        "per number, with model, text id, layer, head, query, key and the token strings: "
        "topk.parquet (per-row top-k of each metric), column_sums.parquet (what each key "
        "gives, summed over queries), heads.parquet (sink rate, sink contribution, entropy, "
        "output share per head) and, with --token-layers, token_level.parquet (heads summed, "
        "full query x key). Read them back with pandas.read_parquet or "
        "cwlens.export.read_tables.",
    )
    add_model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", action="append", help="a text (repeat for several)")
    src.add_argument("--file", help="a UTF-8 text file, one text per line ('-': standard input)")
    src.add_argument("--dataset", help="a shipped dataset: gsm8k, fineweb_edu, ...")
    p.add_argument("--samples", type=int, default=10, help="with --dataset: how many (default: %(default)s)")
    p.add_argument("--out", default="runs/export", help="output folder (default: %(default)s)")
    p.add_argument("--metrics", default="contribution,attention",
                   help="comma-separated metrics (default: %(default)s)")
    p.add_argument("--k", type=int, default=8, help="top-k per row (default: %(default)s)")
    p.add_argument("--token-layers", default="", help="comma-separated layers whose token-level "
                   "matrices are exported in full (default: none)")
    p.add_argument("--max-tokens", type=int, default=512, help="first N tokens of each text (default: %(default)s)")
    p.add_argument("--format", choices=("parquet", "csv"), default="parquet", help="(default: %(default)s)")
    p.set_defaults(func=run)


def _texts(args) -> tuple[list[str], list[str]]:
    if args.text:
        return args.text, [str(i) for i in range(len(args.text))]
    if args.dataset:
        from cwlens.datasets import load_dataset

        samples = load_dataset(args.dataset, args.samples)
        return [getattr(s, "text", "") for s in samples], [s.id for s in samples]
    if args.file == "-":
        lines = sys.stdin.read().splitlines()
    else:
        path = Path(args.file)
        if not path.is_file():
            raise CwlensError(f"--file {args.file!r} does not exist or is not a file")
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as err:
            raise CwlensError(f"--file {args.file!r} is not UTF-8 text ({err.reason})") from err
    texts = [line for line in lines if line.strip()]
    return texts, [str(i) for i in range(len(texts))]


def _ints(value: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError as err:
        raise CwlensError(f"{flag} must be comma-separated ints, e.g. 0,5; got {value!r}") from err


def run(args) -> int:
    from cwlens._types import STREAM_METRICS
    from cwlens.export import export_texts
    from cwlens.models import load_model

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    bad = [m for m in metrics if m not in STREAM_METRICS]
    if not metrics or bad:
        raise CwlensError(f"--metrics {args.metrics!r}: valid metrics are {', '.join(STREAM_METRICS)}")
    for flag, value in (("--k", args.k), ("--max-tokens", args.max_tokens), ("--samples", args.samples)):
        if value < 1:
            raise CwlensError(f"{flag} must be a positive int; got {value}")
    token_layers = _ints(args.token_layers, "--token-layers")
    texts, ids = _texts(args)
    if not texts:
        raise CwlensError("no text to export: pass --text, a non-empty --file or --dataset")
    model = load_model(args.model, device=args.device)
    bad_layers = [ly for ly in token_layers if not 0 <= ly < model.cfg.n_layers]
    if bad_layers:
        raise CwlensError(f"--token-layers {bad_layers} out of range: the model has layers "
                          f"0..{model.cfg.n_layers - 1}")
    paths = export_texts(model, texts, args.out, model_name=args.model, text_ids=ids,
                         metrics=metrics, k=args.k, token_layers=token_layers,
                         max_tokens=args.max_tokens, fmt=args.format)
    for path in paths.values():
        print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
    return 0
