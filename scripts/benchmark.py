"""Cost of cwlens against the model's own forward pass (prints ratios from one run).

For each sequence length n it times, on the same random tokens:
  forward   model(tokens), no hooks
  cwlens    run_with_cache (pattern + v only) and, for every layer, the contribution
            weights (kind="inter") and the three baselines (attention, value-weighted,
            value-weighted output-normalised); each layer's tensors are computed and
            dropped (torch on CPU is synchronous; on CUDA the timer synchronises).
  +intra    the same plus the intra-head contribution weights
and reports ratio = cwlens / forward, with the median of --repeats runs, and peak memory
(CUDA: max allocated; CPU: peak RSS of a fresh subprocess per row, minus the process's
RSS after loading the model).

    python scripts/benchmark.py                      # SmolLM2-135M, n = 128 512 2048, CPU
    python scripts/benchmark.py --device cuda --model llama-3.1-8b --lengths 512 2048
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def sync(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def cwlens_pass(model, tokens, intra=False):
    import cwlens
    from cwlens import adapter

    _, cache = cwlens.run_with_cache(model, tokens)
    kept = 0
    for layer in range(model.cfg.n_layers):
        geo = adapter.geometry(cache, model, layer)
        outs = [
            geo.contribution("inter"),
            geo.attention(),
            geo.value_weighted(),
            geo.value_weighted_output_normalized("inter"),
        ]
        if intra:
            outs.append(geo.contribution("intra"))
        kept += sum(out.numel() for out in outs)
        del geo, outs
    del cache
    return kept


def one_row(model_name, device, n, repeats, dtype):
    import cwlens

    model = cwlens.load_model(model_name, device=device, dtype=dtype)
    base_rss = peak_rss_mb()
    torch.manual_seed(0)
    tokens = torch.randint(100, model.cfg.d_vocab - 100, (1, n), device=device)
    times = {"forward": [], "cwlens": [], "intra": []}
    with torch.no_grad():
        model(tokens)  # warm-up
        cwlens_pass(model, tokens)
        for _ in range(repeats):  # interleaved, so drift hits both alike
            for name, fn in (
                ("forward", lambda: model(tokens)),
                ("cwlens", lambda: cwlens_pass(model, tokens)),
                ("intra", lambda: cwlens_pass(model, tokens, intra=True)),
            ):
                if str(device).startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                sync(device)
                t0 = time.perf_counter()
                fn()
                sync(device)
                times[name].append(time.perf_counter() - t0)
    fwd, cw = statistics.median(times["forward"]), statistics.median(times["cwlens"])
    both = statistics.median(times["intra"])
    if str(device).startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = peak_rss_mb() - base_rss
    return {"n": n, "forward_s": fwd, "cwlens_s": cw, "ratio": cw / fwd,
            "ratio_with_intra": both / fwd, "peak_extra_mb": peak}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--readme", help="also write the table into this markdown file, between "
                    "<!-- benchmark:start --> and <!-- benchmark:end -->")
    ap.add_argument("--row", type=int, help=argparse.SUPPRESS)  # internal: one row, JSON out
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.row is not None:
        print(json.dumps(one_row(args.model, args.device, args.row, args.repeats, dtype)))
        return
    print(f"model {args.model}, device {args.device}, dtype {args.dtype}, torch threads {torch.get_num_threads()}")
    print(f"{'n':>6} {'forward s':>10} {'cwlens s':>10} {'ratio':>7} {'+intra':>7} {'peak extra MB':>14}")
    md = [
        "| n | forward (s) | cache + contribution + baselines (s) | ratio | ratio with intra too | peak extra memory (MB) |",
        "|---|---|---|---|---|---|",
    ]
    for n in args.lengths:
        cmd = [sys.executable, __file__, "--row", str(n), "--model", args.model,
               "--device", args.device, "--dtype", args.dtype, "--repeats", str(args.repeats)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        print(
            f"{r['n']:>6} {r['forward_s']:>10.3f} {r['cwlens_s']:>10.3f} {r['ratio']:>7.2f} "
            f"{r['ratio_with_intra']:>7.2f} {r['peak_extra_mb']:>14.0f}"
        )
        md.append(
            f"| {r['n']} | {r['forward_s']:.3f} | {r['cwlens_s']:.3f} | {r['ratio']:.2f} | "
            f"{r['ratio_with_intra']:.2f} | {r['peak_extra_mb']:.0f} |"
        )
    if args.readme:
        write_block(args.readme, "\n".join(md), args)


def write_block(path, table: str, args) -> None:
    import platform
    from pathlib import Path

    start, end = "<!-- benchmark:start -->", "<!-- benchmark:end -->"
    text = Path(path).read_text(encoding="utf-8")
    if start not in text or end not in text:
        raise SystemExit(f"{path} has no {start} ... {end} block")
    cmd = f"python scripts/benchmark.py --lengths {' '.join(map(str, args.lengths))} --readme {path}"
    block = (
        f"{start}\nMeasured with `{cmd}` ({args.model}, {args.device}, {args.dtype}, "
        f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}; "
        f"median of {args.repeats} interleaved runs):\n\n{table}\n{end}"
    )
    Path(path).write_text(text[: text.index(start)] + block + text[text.index(end) + len(end):], encoding="utf-8")


if __name__ == "__main__":
    main()
