"""Time the streamed pass's block kernel (cwlens/engine/native/block_measures.c) on one
causal block of SmolLM2-135M's shape: built with OpenMP (its threads are torch's), with
OpenMP without AVX-512, and without OpenMP (threads of its own), on 1 and 2 threads,
against the torch path it replaces (the contribution's product by a bmm, the product by a,
the finiteness check, the column sums, three top-k lists with the C top-k) and that path
with torch's top-k (what ``CWLENS_NATIVE=0`` runs). Minimum of --repeats calls each, alternated in one
process (these machines are noisy); prints milliseconds and ratios.

    python scripts/benchmark_block_kernel.py                  # [9, 227, 4096]
    python scripts/benchmark_block_kernel.py --keys 8192 --rows 113
"""

import argparse
import os
import tempfile
import time

import torch


def block(rows: int, keys: int, heads: int = 9, kv: int = 3, d: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    start = keys - rows
    pos = torch.arange(start, keys)
    scores = torch.randn(heads, rows, keys, generator=g) * 2
    scores = scores.masked_fill(torch.arange(keys)[None, :] > pos[:, None], float("-inf"))
    alpha = scores.softmax(-1)
    u = torch.randn(heads, rows, d, generator=g) * 0.01
    v = torch.randn(keys, kv, d, generator=g)
    vnorm = torch.rand(heads, keys, generator=g) + 0.5
    inv1 = torch.rand(1, rows, generator=g) + 0.5
    return alpha, u, v, vnorm, inv1, torch.zeros(rows, dtype=torch.int64), pos + 1


def torch_path(native, alpha, u, v, vnorm, inv1, lo, hi, c_topk: bool = True):
    """What the streamed pass computes for this block without the fused kernel: its top-k
    lists with the C top-k (``c_topk``), or with torch's (``CWLENS_NATIVE=0``: no kernel)."""
    from cwlens.engine.row_topk import _row_topk  # the torch top-k the streamed pass runs

    h, q, width = alpha.shape
    kv = v.shape[1]
    dot = torch.matmul(u.reshape(kv, h // kv * q, -1), v.permute(1, 2, 0)).view(h, q, -1)
    c = dot.mul_(alpha)
    assert bool(torch.isfinite(c.sum()))
    sums = (c.sum(1), alpha.sum(1), torch.matmul(inv1[:, None, :], alpha).squeeze(1))
    if c_topk:
        tops = [native.row_topk(x[None], 8, False, s, lo, hi) for x, s in ((c, None), (alpha, None), (alpha, vnorm[None]))]
    else:
        j = torch.arange(width)
        allowed = ((j >= lo[:, None]) & (j < hi[:, None]))[None, None]
        tops = [_row_topk(x[None], 8, False, None, allowed) for x in (c, alpha, alpha * vnorm[:, None, :])]
    return sums, tops


def best_ms(fn, repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=4096, help="keys of the block (its last query's position + 1)")
    ap.add_argument("--rows", type=int, default=227, help="queries of the block (227: the CPU's 32 MiB block at 4096)")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    if args.rows < 1 or args.keys < args.rows or args.repeats < 1:
        ap.error(f"need 1 <= --rows <= --keys and --repeats >= 1; got --rows {args.rows}, --keys {args.keys}, "
                 f"--repeats {args.repeats}")
    from cwlens.engine import native

    if not native.available():
        ap.error("no C kernels here (no compiler, or CWLENS_NATIVE=0): nothing to time")

    alpha, u, v, vnorm, inv1, lo, hi = block(args.rows, args.keys)
    panels = native.value_panels(v)
    builds = {}
    saved = native.OPENMP, os.environ.get("CWLENS_CACHE")
    flags = native.FLAGS
    for name, openmp, extra in (("OpenMP", saved[0], ()), ("OpenMP, -mno-avx512f", saved[0], ("-mno-avx512f",)),
                                ("own threads", (), ())):
        with tempfile.TemporaryDirectory() as tmp:  # a build of its own (loaded: it may go)
            native.OPENMP, native.FLAGS = openmp, (*flags, *extra)
            os.environ["CWLENS_CACHE"] = tmp
            native._state.pop("lib", None)
            builds[name] = native.library()
    native.OPENMP, native.FLAGS = saved[0], flags
    if saved[1] is None:
        os.environ.pop("CWLENS_CACHE")
    else:
        os.environ["CWLENS_CACHE"] = saved[1]
    native._state.pop("lib", None)
    threads = torch.get_num_threads()
    rows = []
    inputs = native.BlockInputs(alpha, u, panels, vnorm, inv1, lo, hi)
    for n in (1, 2):
        torch.set_num_threads(n)
        for name, lib in builds.items():
            native._state["lib"] = lib
            fused = best_ms(lambda: native.block_measures(inputs, 8, native.TOPK_METRICS, True, True), args.repeats)
            unfused = best_ms(lambda: torch_path(native, alpha, u, v, vnorm, inv1, lo, hi), args.repeats)
            alone = best_ms(lambda: torch_path(native, alpha, u, v, vnorm, inv1, lo, hi, False), args.repeats)
            rows.append((n, name, fused, unfused, alone))
    torch.set_num_threads(threads)
    native._state.pop("lib", None)
    print(f"block [9, {args.rows}, {args.keys}] (causal), minimum of {args.repeats} calls, milliseconds")
    print("| threads | kernels built with | fused kernel | torch path (C top-k) | torch path (torch top-k) "
          "| C top-k / fused | torch top-k / fused |")
    print("|---|---|---|---|---|---|---|")
    for n, name, fused, unfused, alone in rows:
        print(f"| {n} | {name} | {fused:.1f} | {unfused:.1f} | {alone:.1f} | {unfused / fused:.2f} | {alone / fused:.2f} |")
    one = {name: f for n, name, f, *_ in rows if n == 1}
    for n, name, fused, *_ in rows:
        if n == 2:
            print(f"{name}: fused kernel, 1 thread / 2 threads = {one[name] / fused:.2f}")


if __name__ == "__main__":
    main()
