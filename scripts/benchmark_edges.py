"""Time the per-edge truth (cwlens.groundtruth.edge_effects) on SmolLM2-135M: every edge of
the last query of a 64-token text, on the prefix path (float32 and float64) next to the
naive path (a whole forward per edge, batched) and plain forward passes, in one run.

The naive path is timed on the edges of ``--naive-layers`` layers (all 30 take minutes)
and its edges per second extrapolated; its effects are checked equal to the prefix path's
on those edges. Prints one table and, with --json, writes it.

    python scripts/benchmark_edges.py [--tokens 64] [--naive-layers 2] [--json out.json]

Goals (issue 47): float32 <= 20 s; float64 <= 400 plain float64 forward passes of the text.
"""

import argparse
import json
import os
import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--naive-layers", type=int, default=2)
    parser.add_argument("--forwards", type=int, default=5, help="plain forwards timed (median)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--docs", default=None, help="also write the table into this page "
                        "(docs/edge_truth.md, between <!-- edge-benchmark:start/end -->)")
    args = parser.parse_args(argv)
    if args.tokens < 2 or args.naive_layers < 1 or args.forwards < 1:
        parser.error("--tokens must be >= 2, --naive-layers and --forwards >= 1")

    import cwlens
    from cwlens.datasets import load_dataset
    from cwlens.groundtruth.edges import edge_effects, model_in

    torch.set_grad_enabled(False)
    model = cwlens.load_model("smollm2-135m")
    handle = cwlens.wrap(model)
    text = " ".join(s.text for s in load_dataset("gsm8k", 4))
    tokens = handle.to_tokens(text)[:, : args.tokens]
    if tokens.shape[1] < args.tokens:
        parser.error(f"the text has only {tokens.shape[1]} tokens")
    n_layers = handle.n_layers
    row: dict = {"model": "smollm2-135m", "tokens": args.tokens, "threads": torch.get_num_threads()}

    def plain(m) -> float:
        times = []
        for _ in range(args.forwards + 1):
            t = time.perf_counter()
            m(tokens)
            times.append(time.perf_counter() - t)
        return sorted(times[1:])[len(times[1:]) // 2]

    m64 = model_in(model, torch.float64)
    row["plain_f32_s"] = plain(model)
    row["plain_f64_s"] = plain(m64)
    edge_effects(model, tokens, layers=[n_layers - 1], dtype=torch.float32)  # warm
    for name, dtype in (("f32", torch.float32), ("f64", torch.float64)):
        t = time.perf_counter()
        fx = edge_effects(model, tokens, dtype=dtype)
        row[f"prefix_{name}_s"] = time.perf_counter() - t
        row["edges"] = fx.n_edges
        row[f"prefix_{name}_edges_per_s"] = fx.n_edges / row[f"prefix_{name}_s"]
        if name == "f64":
            full64 = fx
    layers = list(range(n_layers - args.naive_layers, n_layers))
    t = time.perf_counter()
    naive = edge_effects(model, tokens, layers=layers, dtype=torch.float64, path="full")
    row["naive_f64_s_sampled"] = time.perf_counter() - t
    row["naive_f64_edges_per_s"] = naive.n_edges / row["naive_f64_s_sampled"]
    row["naive_f64_s_all_edges_est"] = row["edges"] / row["naive_f64_edges_per_s"]
    sub = full64.effect[-args.naive_layers:]
    row["max_abs_diff_prefix_vs_naive_f64"] = float((sub - naive.effect).abs().max())
    row["prefix_f64_in_plain_f64_forwards"] = row["prefix_f64_s"] / row["plain_f64_s"]
    row["speedup_prefix_vs_naive_f64"] = row["prefix_f64_edges_per_s"] / row["naive_f64_edges_per_s"]
    width = max(len(k) for k in row)
    for k, v in row.items():
        print(f"{k:<{width}}  {v:.4g}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    print(f"goals: float32 <= 20 s ({row['prefix_f32_s']:.1f} s); float64 <= 400 plain float64 "
          f"forwards ({row['prefix_f64_in_plain_f64_forwards']:.0f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f, indent=2)
    if args.docs:
        _write_docs(args, row)
    return 0


def _write_docs(args, row: dict) -> None:
    from cwlens.faithfulness.report import write_block

    load = os.getloadavg()[0]
    flags = (f" --tokens {args.tokens}" if args.tokens != 64 else "") + (
        f" --naive-layers {args.naive_layers}" if args.naive_layers != 2 else "")
    table = "\n".join([
        f"`python scripts/benchmark_edges.py{flags} --docs {args.docs}` (SmolLM2-135M, {row['tokens']} "
        f"tokens, {row['edges']:,} edges, {row['threads']} torch threads, load average "
        f"{load:.1f} at the end; load_model's float32 weights, float64 a copy):", "",
        "| | float32 | float64 |", "|---|---|---|",
        f"| a plain forward pass of the text | {row['plain_f32_s']:.3f} s | {row['plain_f64_s']:.3f} s |",
        f"| every edge, prefix path | {row['prefix_f32_s']:.1f} s ({row['prefix_f32_edges_per_s']:.0f} "
        f"edges/s) | {row['prefix_f64_s']:.1f} s ({row['prefix_f64_edges_per_s']:.0f} edges/s) |",
        f"| every edge, naive path (a whole forward per edge; {args.naive_layers} layers timed, "
        f"extrapolated) | | {row['naive_f64_s_all_edges_est']:.0f} s ({row['naive_f64_edges_per_s']:.0f} "
        f"edges/s) |", "",
        f"Prefix path in float64 = {row['prefix_f64_in_plain_f64_forwards']:.0f} plain float64 forward "
        f"passes (goal <= 400); float32 {row['prefix_f32_s']:.1f} s (goal <= 20 s); prefix / naive "
        f"speed-up {row['speedup_prefix_vs_naive_f64']:.0f}x; largest difference between the two paths "
        f"on the naive layers' edges {row['max_abs_diff_prefix_vs_naive_f64']:.1e} (float64)."])
    write_block(args.docs, table, "<!-- edge-benchmark:start -->", "<!-- edge-benchmark:end -->")


if __name__ == "__main__":
    sys.exit(main())
