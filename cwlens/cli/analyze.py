"""``cwlens analyze``: a self-contained HTML report for one text, plus a terminal summary."""

import math
import sys

from cwlens.cli import arg_types
from cwlens.cli.common import add_model_args, add_past_context_flag, add_progress_flag, load_handle
from cwlens.errors import EmptyInputError, InvalidArgumentError, LayerOutOfRangeError


def register(sub) -> None:
    p = sub.add_parser(
        "analyze",
        help="HTML report (offline) of attention vs contribution for one text",
        description="Runs the model once on a text and writes a self-contained HTML report "
        "(works offline): sink statistics per layer, token-level and per-head attention vs "
        "contribution heatmaps with the factor split on hover, the factor split for the "
        "last query, and the top contributing tokens per query. Prints a short summary.",
    )
    add_model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="the text to analyse")
    src.add_argument("--file", type=arg_types.text_file,
                     help="a UTF-8 text file to analyse ('-' for standard input)")
    p.add_argument("--out", default="runs/report.html", help="report path (default: %(default)s)")
    p.add_argument("--max-tokens", type=arg_types.max_tokens, default=4096,
                   help="analyse the first N tokens (default: %(default)s)")
    add_past_context_flag(p)
    p.add_argument("--window", type=arg_types.positive_int, default=64,
                   help="draw the heatmaps for the last N tokens; every other number covers all "
                   "tokens (default: %(default)s; capped so that the report fits --max-mb)")
    p.add_argument("--max-mb", type=arg_types.positive_float, default=50.0,
                   help="largest report size in MB (default: %(default)s)")
    p.add_argument("--layers", default=None, type=arg_types.layer_list,
                   help="comma-separated layers for the per-head heatmaps (default: 4 spread over the depth)")
    p.add_argument("--kind", choices=("intra", "inter"), default="intra",
                   help="the contribution the per-head heatmaps set beside attention: intra (to "
                   "the head's own output, each row sums to 1 like attention) or inter (to the "
                   "layer's output: a head's row sums to its share of it, not 1); the "
                   "token-level view is inter, heads summed (default: %(default)s)")
    p.add_argument("--graph-top-k", type=arg_types.non_negative_int, default=4,
                   help="the report's contribution graph: edges kept per node besides the "
                   "residual's (default: %(default)s; 0: no graph; docs/graph.md)")
    add_progress_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from cwlens.report import analyze_text, render_report

    text = args.text if args.text is not None else arg_types.read_text(args.file)
    if not text.strip():
        raise EmptyInputError("the text is empty: pass --text or a non-empty --file")
    out = arg_types.html_file(args.out)
    from cwlens.report.html import estimated_bytes, fixed_bytes, window_for

    if args.max_mb * 1e6 < fixed_bytes():
        raise InvalidArgumentError(
            f"--max-mb {args.max_mb:g} is below the report's fixed part, about "
            f"{fixed_bytes() / 1e6:.1f} MB (the inlined plotly.js, which makes it open offline, "
            f"and the tables) before any heatmap: pass --max-mb {math.ceil(fixed_bytes() / 1e6) + 1} "
            "or more")
    handle = load_handle(args)
    layers = list(args.layers) if args.layers else None
    if layers is not None:
        bad = [ly for ly in layers if not 0 <= ly < handle.n_layers]
        if bad:
            raise LayerOutOfRangeError(
                f"--layers {','.join(map(str, bad))} out of range: the model has layers "
                f"0..{handle.n_layers - 1}"
            )
    n_head_layers = len(layers) if layers is not None else min(4, handle.n_layers)
    n_tokens = min(handle.to_tokens(text, truncate=False).shape[-1], args.max_tokens)
    window = min(args.window, n_tokens)  # a window past the text's end draws the text
    if estimated_bytes(handle.n_layers, handle.n_heads, n_head_layers, window) > args.max_mb * 1e6:
        window = window_for(args.max_mb, handle.n_layers, handle.n_heads, n_head_layers)
        if window < 2:
            raise InvalidArgumentError(
                f"--max-mb {args.max_mb:g} leaves no room for the heatmaps of this "
                f"{handle.n_layers}-layer, {handle.n_heads}-head model after the fixed "
                f"{fixed_bytes() / 1e6:.1f} MB; pass a larger --max-mb, or fewer --layers")
        print(f"cwlens: note: --window {args.window} would make the report larger than "
              f"--max-mb {args.max_mb:g}; drawing the last {window} tokens instead", file=sys.stderr)
    from cwlens.runs.progress import bar

    with bar(handle.n_layers, f"streaming {n_tokens} tokens", "layer", enabled=not args.no_progress,
             ticks=True):
        analysis = analyze_text(handle, text, model_name=args.model, max_tokens=args.max_tokens,
                                window=window, past_context=args.past_context, head_kind=args.kind,
                                graph_top_k=args.graph_top_k)
    written = render_report(analysis, out, layers)
    print("\n".join(analysis.summary_lines(layers=layers)))
    print(f"\nwrote {written} ({written.stat().st_size / 1e6:.1f} MB, opens offline)")
    return 0
