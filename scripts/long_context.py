"""Long-context sink study: attention vs contribution received by the first token and by
StreamingLLM's first four tokens, as a function of query position, per layer group.

One text: the shipped FineWeb-Edu documents (then the Wikipedia substitute, if more tokens
are needed) joined by blank lines, tokenized once (the model's own BOS first, no cut at
the model's context length) and cut at ``--tokens``. One streamed forward pass
(:func:`cwlens.stream_reduce` with two :class:`cwlens.reducers.KeySetWeight` reducers:
attention and the inter-head contribution, every layer) records what each key set
receives from every query; :mod:`cwlens.sinks.by_position` bins the queries by position
(log-spaced) per layer third. Writes to ``--out``:

  curves.csv      key_set, keys, metric, group, layers, bin_lo, bin_hi, position,
                  n_queries, mean, low, high (the --interval quantiles over the bin's queries)
  per_layer.csv   per key set, metric and layer: the mean over queries at positions >= 64
  summary.json    the run (model, tokens, documents, attention path, time, peak RSS), both
                  tables and the mean over the queries of positions 16-63, 64-255, ... (printed)
  long_context.html / .png   the figure (cwlens.plotting.long_context; elsewhere with --figure)

    OMP_NUM_THREADS=2 nice python scripts/long_context.py --tokens 2048 --out results/long_context_2048
    python scripts/long_context.py --tokens 16384 --attention blockwise --out results/long_context_16k
"""

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import torch

import cwlens
from cwlens.cli.arg_types import positive_int
from cwlens.datasets import load_dataset
from cwlens.engine import adapter, reducers
from cwlens.engine.batching import token_ids
from cwlens.engine.handle import wrap
from cwlens.engine.models.registry import model_label
from cwlens.errors import CwlensError
from cwlens.sinks.by_position import per_layer_means, position_curves, range_means

SOURCES = ("fineweb_edu", "fineweb_edu_substitute_wikipedia")
KEY_SETS = {"first_token": (0,), "first_4_tokens": (0, 1, 2, 3)}
METRICS = ("attention", "contribution")


def long_text(model, n_tokens: int) -> tuple[torch.Tensor, dict]:
    """``(tokens [1, n_tokens], provenance)``: the shipped documents of :data:`SOURCES`, in
    order, joined by blank lines until the text has ``n_tokens`` tokens."""
    docs: list[tuple[str, str]] = []
    for source in SOURCES:
        docs += [(source, s.text) for s in load_dataset(source)]
    used, chars = 0, 0
    ids = torch.zeros(0, dtype=torch.long)
    while len(ids) < n_tokens:
        if used == len(docs):
            raise CwlensError(
                f"--tokens {n_tokens} is more than the shipped texts hold ({len(ids)} tokens "
                f"with this tokenizer, from {', '.join(SOURCES)}): ask for at most {len(ids)}.")
        # about 4 characters a token: add documents up to 5 per missing token, then count
        while used < len(docs) and chars < 5 * n_tokens:
            chars += len(docs[used][1]) + 2
            used += 1
        ids = token_ids(model, "\n\n".join(text for _, text in docs[:used]), truncate=False)
        chars = max(chars, int(chars * n_tokens / max(len(ids), 1)) + 1)
    by_source = {s: sum(1 for src, _ in docs[:used] if src == s) for s in SOURCES}
    return ids[:n_tokens][None], {"documents": {s: n for s, n in by_source.items() if n},
                                  "documents_note": "the last document is cut at --tokens"}


def stream_kwargs(attention: str | None, query_block: int) -> dict:
    """The stream options: ``attention`` (auto unless given) and ``logits=False`` (no
    ``[n, vocab]`` logits: not needed here)."""
    return {"query_block": query_block, "logits": False, "attention": attention or "auto"}


def markdown(table) -> str:
    """A pipe table (numbers to 3 decimals)."""
    cells = [[f"{v:.3f}" if isinstance(v, float) else str(v) for v in row] for row in table.itertuples(index=False)]
    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|---" * len(table.columns) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=positive_int, default=16384, help="length of the text (default 16384)")
    ap.add_argument("--model", default="smollm2-135m", help="a cwlens.load_model name or a local directory")
    ap.add_argument("--out", type=Path, default=Path("runs/long_context"),
                    help="output folder (default: %(default)s; the committed runs name results/...)")
    ap.add_argument("--attention", choices=("auto", "eager", "blockwise"), default=None,
                    help="cwlens's attention path, where the installed cwlens has one (default: auto)")
    ap.add_argument("--query-block", type=positive_int, default=256, help="queries per block (default 256)")
    ap.add_argument("--per-octave", type=positive_int, default=4, help="position bins per doubling (default 4)")
    ap.add_argument("--interval", type=float, nargs=2, default=(0.1, 0.9), metavar=("LOW", "HIGH"),
                    help="quantiles of the queries in a bin drawn as the band (default 0.1 0.9)")
    ap.add_argument("--from-position", type=positive_int, default=64,
                    help="per_layer.csv averages the queries at positions >= this (default 64)")
    ap.add_argument("--figure", type=Path, default=None,
                    help="path stem of the figure (default: <out>/long_context), e.g. figures/long_context_smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-png", action="store_true", help="write the figure as HTML only")
    args = ap.parse_args(argv)
    if not 0 <= args.interval[0] <= args.interval[1] <= 1:
        ap.error(f"argument --interval: expected quantiles 0 <= LOW <= HIGH <= 1; got {args.interval}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    kwargs = stream_kwargs(args.attention, args.query_block)
    model = cwlens.load_model(args.model, device=args.device)
    if wrap(model).is_encoder:
        raise CwlensError(f"{args.model} is an encoder: the study follows causal queries along a text; "
                          "pass a decoder (e.g. --model smollm2-135m).")
    info = adapter.ModelInfo.of(model)
    tokens, provenance = long_text(model, args.tokens)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    res = cwlens.stream_reduce(model, tokens.to(args.device),
                               [reducers.KeySetWeight(keys, METRICS, name=name) for name, keys in KEY_SETS.items()],
                               **kwargs)
    seconds = time.perf_counter() - start
    results = {name: res[name] for name in KEY_SETS}
    curves = position_curves(results, info.n_layers, METRICS, args.per_octave, tuple(args.interval))
    layers = per_layer_means(results, METRICS, args.from_position)
    wide = range_means(curves)
    args.out.mkdir(parents=True, exist_ok=True)
    curves.to_csv(args.out / "curves.csv", index=False)
    layers.to_csv(args.out / "per_layer.csv", index=False)
    label = model_label(args.model)
    summary = {
        "command": "python scripts/long_context.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "model": args.model, "model_label": label, "tokens": int(tokens.shape[1]),
        "context_length": wrap(model).context_length(),
        "first_tokens": [str(t) for t in model.to_str_tokens(tokens[0, :4])],
        **provenance, "attention": kwargs.get("attention", "eager (no blockwise path installed)"),
        "query_block": args.query_block, "kind": "inter", "metrics": list(METRICS),
        "key_sets": {k: list(v) for k, v in KEY_SETS.items()}, "per_octave": args.per_octave,
        "interval_quantiles": list(args.interval), "stream_seconds": round(seconds, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_rss_mb_before_stream": round(rss_before, 1), "torch_threads": torch.get_num_threads(),
        "range_means": wide.to_dict("records"),
        "curves": curves.to_dict("records"), "per_layer": layers.to_dict("records"),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    from cwlens.plotting.export import save_figure
    from cwlens.plotting.long_context import sink_share_by_position

    fig = sink_share_by_position(curves, label, int(tokens.shape[1]),
                                 f"{args.interval[0]:g}-{args.interval[1]:g} quantiles of queries")
    written = save_figure(fig, args.figure or args.out / "long_context", png=not args.no_png)
    print(f"{label}: {tokens.shape[1]} tokens, streamed in {seconds:.1f} s "
          f"(attention: {summary['attention']}), peak RSS {summary['peak_rss_mb']:.0f} MB")
    print(markdown(wide))
    print("wrote " + ", ".join(str(p) for p in [args.out / "curves.csv", args.out / "per_layer.csv",
                                                  args.out / "summary.json", *written]))
    return summary


if __name__ == "__main__":
    main()
