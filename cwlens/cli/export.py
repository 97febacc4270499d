"""``cwlens export``: streamed reductions of texts as tidy Parquet (or CSV) tables."""

from cwlens.cli import arg_types
from cwlens.cli.common import add_model_args, add_past_context_flag, add_progress_flag, load_handle
from cwlens.core._types import STREAM_METRICS
from cwlens.errors import EmptyInputError, InvalidArgumentError, LayerOutOfRangeError


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="per-row top-k, column sums, head summaries (and token-level matrices) as Parquet",
        description="Runs the streaming engine on each text and writes tidy tables, one row "
        "per number, with model, text id, layer, head, query, key and the token strings: "
        "topk.parquet (per-row top-k of each metric: its k largest values, so a signed "
        "contribution's opposing keys are left out; add contribution_abs for the largest in "
        "magnitude), column_sums.parquet (what each key "
        "gives, summed over queries), heads.parquet (sink rate, sink contribution, entropy, "
        "output share per head) and, with --token-layers, token_level.parquet (heads summed, "
        "full query x key). Read them back with pandas.read_parquet or "
        "cwlens.report.export.read_tables.",
    )
    add_model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", action="append", help="a text (repeat for several)")
    src.add_argument("--file", type=arg_types.text_file,
                     help="a UTF-8 text file, one text per line ('-': standard input)")
    src.add_argument("--dataset", type=arg_types.dataset_list(("text",)),
                     help="a shipped text dataset: gsm8k, fineweb_edu, ...")
    p.add_argument("--samples", type=arg_types.positive_int, default=None,
                   help="with --dataset: how many per dataset (default: 10)")
    p.add_argument("--out", default="runs/export", help="output folder (default: %(default)s)")
    p.add_argument("--metrics", default=("contribution", "attention"),
                   type=arg_types.choice_list(STREAM_METRICS, "metric"),
                   help="comma-separated metrics (default: contribution,attention)")
    p.add_argument("--k", type=arg_types.positive_int, default=8, help="top-k per row (default: %(default)s)")
    p.add_argument("--token-layers", type=arg_types.layer_list, default=(),
                   help="comma-separated layers whose token-level matrices are exported in "
                   "full (default: none)")
    p.add_argument("--max-tokens", type=arg_types.max_tokens, default=512,
                   help="first N tokens of each text (default: %(default)s; never more than the "
                   "model's context: longer texts are cut to it with a note)")
    add_past_context_flag(p)
    p.add_argument("--format", choices=("parquet", "csv"), default="parquet", help="(default: %(default)s)")
    add_progress_flag(p)
    p.set_defaults(func=run)


def _texts(args) -> tuple[list[str], list[str]]:
    if args.samples is not None and not args.dataset:
        raise InvalidArgumentError(f"--samples applies to --dataset only (this run exports "
                                   f"{'--text' if args.text else '--file'}); drop it")
    if args.text:
        blank = [i for i, t in enumerate(args.text) if not t.strip()]
        if blank:
            raise EmptyInputError(f"--text number {blank[0] + 1} is empty: pass texts with at "
                                  "least one word")
        return args.text, [str(i) for i in range(len(args.text))]
    if args.dataset:
        from cwlens.datasets import load_dataset

        samples = [s for name in args.dataset for s in load_dataset(name, args.samples or 10)]
        return [getattr(s, "text", "") for s in samples], [s.id for s in samples]
    lines = arg_types.read_text(args.file).splitlines()
    texts = [line for line in lines if line.strip()]
    return texts, [str(i) for i in range(len(texts))]


def run(args) -> int:
    from cwlens.report.export import export_texts
    from cwlens.runs.progress import bar

    texts, ids = _texts(args)
    if not texts:
        raise EmptyInputError("no text to export: pass --text, a non-empty --file or --dataset")
    out = arg_types.output_dir(args.out)
    handle = load_handle(args)
    n_layers = handle.n_layers
    bad_layers = [ly for ly in args.token_layers if not 0 <= ly < n_layers]
    if bad_layers:
        raise LayerOutOfRangeError(f"--token-layers {','.join(map(str, bad_layers))} out of range: "
                                   f"the model has layers 0..{n_layers - 1}")
    with bar(len(texts), "texts exported", "text", enabled=not args.no_progress, ticks=True):
        paths = export_texts(handle, texts, out, model_name=args.model, text_ids=ids,
                             metrics=args.metrics, k=args.k, token_layers=args.token_layers,
                             max_tokens=args.max_tokens, fmt=args.format,
                             past_context=args.past_context)
    for path in paths.values():
        print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
    return 0
