"""``cwlens graph``: a text's contribution graph as one interactive HTML page (offline)."""

import sys
import time

from cwlens.cli import arg_types
from cwlens.cli.common import add_model_args, add_progress_flag, load_handle
from cwlens.errors import EmptyInputError


def register(sub) -> None:
    from cwlens.core.metrics import GEOMETRY

    p = sub.add_parser(
        "graph",
        help="interactive contribution graph of one text (HTML, offline)",
        description="Runs the model once on a text (the streaming engine: any length) and "
        "writes the contribution graph, nodes (layer, position), edges the layer's weight of "
        "each key plus the residual's share, as a self-contained HTML viewer: two metrics "
        "side by side on one layout, threshold and top-k sliders, routes, token search, "
        "pan and zoom (docs/graph.md).",
    )
    add_model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text")
    src.add_argument("--file", type=arg_types.text_file,
                     help="a UTF-8 text file ('-' for standard input)")
    p.add_argument("--out", default="runs/graph/graph.html", help="page path (default: %(default)s)")
    p.add_argument("--metric", default="contribution", choices=GEOMETRY,
                   help="the metric that splits attention over keys (default: %(default)s)")
    p.add_argument("--compare", default="attention", choices=(*GEOMETRY, "none"),
                   help="a second metric, side by side on the same layout (default: %(default)s)")
    p.add_argument("--top-k", type=arg_types.positive_int, default=8,
                   help="edges kept per node besides the residual's (default: %(default)s)")
    p.add_argument("--layers", default=None, type=arg_types.layer_list,
                   help="comma-separated blocks whose edges to build (default: all)")
    p.add_argument("--max-tokens", type=arg_types.max_tokens, default=4096,
                   help="the first N tokens of the text (default: %(default)s)")
    add_progress_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import cwlens
    from cwlens.engine.tokens import token_ids
    from cwlens.runs.progress import bar

    text = args.text if args.text is not None else arg_types.read_text(args.file)
    if not text.strip():
        raise EmptyInputError("the text is empty: pass --text or a non-empty --file")
    out = arg_types.html_file(args.out)
    handle = load_handle(args)
    ids = token_ids(handle, text, truncate=False)[: args.max_tokens]
    compare = None if args.compare == "none" or args.compare == args.metric else args.compare
    layers = list(args.layers) if args.layers else None
    start = time.perf_counter()
    with bar(handle.n_layers, f"streaming {len(ids)} tokens", "layer",
             enabled=not args.no_progress, ticks=True):
        g = cwlens.graph(handle.model, ids, metric=args.metric, top_k=args.top_k, layers=layers,
                         compare=compare)
    built = time.perf_counter() - start
    written = g.save(out, title=f"Contribution graph · {args.model}")
    print(g)
    print(f"built in {built:.1f} s; wrote {written} ({written.stat().st_size / 1e6:.1f} MB, "
          "opens offline)", file=sys.stdout)
    return 0
