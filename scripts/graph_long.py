"""Build the contribution graph of one long text (SmolLM2-135M, the shipped FineWeb-Edu
sample concatenated until it is long enough, past the model's 8192-token context: RoPE
runs on) and report its wall time, CPU time, peak memory, edges and the viewer page's
size. Issue 48: 32k tokens without running out of memory.

    python scripts/graph_long.py [--tokens 32768] [--top-k 8] [--page runs/graph/long.html]
                                 [--docs docs/graph.md]
"""

import argparse
import os
import resource
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
warnings.filterwarnings("ignore")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--page", default="runs/graph/long.html")
    parser.add_argument("--docs", default=None, help="write the result into this page's "
                        "<!-- graph-long:start/end --> block")
    args = parser.parse_args(argv)
    if args.tokens < 2 or args.top_k < 1:
        parser.error("--tokens must be >= 2 and --top-k >= 1")

    import torch

    import cwlens
    from cwlens.datasets import load_dataset

    model = cwlens.load_model("smollm2-135m")
    handle = cwlens.wrap(model)
    texts = [s.text for s in load_dataset("fineweb_edu")]
    ids: list[int] = []
    while len(ids) < args.tokens:
        for t in texts:
            ids += handle.to_tokens(t, prepend_bos=False)[0].tolist()
    tokens = torch.tensor(ids[: args.tokens])
    t0, c0 = time.perf_counter(), time.process_time()
    g = cwlens.graph(model, tokens, top_k=args.top_k)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    os.makedirs(os.path.dirname(args.page) or ".", exist_ok=True)
    g.save(args.page)
    size_mb = os.path.getsize(args.page) / 1e6
    n_edges = len(g.to_pandas())
    limit = handle.context_length() or 0
    past = f", past its {limit:,}-token context" if limit and args.tokens > limit else ""
    line = (f"`python scripts/graph_long.py --tokens {args.tokens}` (SmolLM2-135M, {args.tokens:,} "
            f"tokens of the shipped FineWeb-Edu sample{past}; top-k "
            f"{args.top_k}, contribution and attention; {torch.get_num_threads()} torch threads): "
            f"built in {wall / 60:.1f} min wall ({cpu / 60:.1f} min CPU), peak resident memory "
            f"{peak_gb:.2f} GB, {n_edges:,} edges; the page {size_mb:.1f} MB.")
    print(line)
    if args.docs:
        from cwlens.faithfulness.report import write_block

        write_block(args.docs, line, "<!-- graph-long:start -->", "<!-- graph-long:end -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
