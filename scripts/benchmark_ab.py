"""The streamed pass of two checkouts of cwlens, timed alternately (A, B, A, B, ...).

A change to the streamed pass is kept only if it wins in a run like this one: each turn is
a fresh process of one checkout (``PYTHONPATH`` set to it) that loads the same random-
weight model, warms up once and times ``--inner`` streamed passes (the reducers of
``scripts/benchmark.py --stream``: contribution and the three baselines to top-8 and
column sums, every layer, blockwise attention); the processes of A and B alternate, so
drift in the machine's load hits both alike. Each pass is timed in CPU seconds of its
process (user + system: less sensitive than wall time to other jobs on a shared machine)
and in wall seconds. It prints every process's times and, per checkout, the median, and
the ratio B / A with the spread of the per-round ratios (how noisy the run was).

    git worktree add /tmp/wt-base <commit>
    python scripts/benchmark_ab.py /tmp/wt-base . --n 2048 --layers 4 --rounds 5
    python scripts/benchmark_ab.py /tmp/wt-base . --what ranking --n 16384 --inner 3

``--what ranking`` times the faithfulness row masks instead (see its help).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
import torch
torch.set_num_threads({threads})
import cwlens
from cwlens import reducers
from cwlens.engine.models.random_init import random_model

M = ("contribution", "attention", "value_weighted", "value_weighted_output_normalized")
model = random_model({shape!r}, n_layers={layers})
torch.manual_seed(0)
tokens = torch.randint(100, model.cfg.d_vocab - 100, (1, {n}))

def once():
    rs = [reducers.TopK(8, m) for m in M] + [reducers.ColumnSums(m) for m in M]
    return cwlens.stream_reduce(model, tokens, rs, attention="blockwise", logits=False)

"""


RANKING = r"""
import json, resource, sys, time
from types import SimpleNamespace
import torch
torch.set_num_threads({threads})
from cwlens.faithfulness.job_masks import Piece, job_masks
from cwlens.faithfulness.ranking import (RowBlock, eligible_rows, first_token, random_scores,
                                         tiebreak_scores)

n, h, rows = {n}, 9, max(1, 2**22 // (9 * {n}))  # one lockstep sub-block of the last rows
mask = torch.ones(1, n, dtype=torch.bool)
block = RowBlock(n - rows, rows, n)
shape = (1, h, rows, n)
g = torch.Generator().manual_seed(0)
contribution = torch.randn(shape, generator=g) * torch.rand(shape, generator=g) ** 4
elig = eligible_rows(mask, block)
first = first_token(mask)

def scores_of(metric):
    if metric == "random":
        return random_scores(shape, mask, ["s"], 0, 0, block.query_start)
    return contribution

piece = Piece(shape, elig, first, scores_of,
              lambda: tiebreak_scores(shape, mask, ["s"], 0, 0, block.query_start))
jobs = [((m, 0.1), SimpleNamespace(metric=m, rate=0.1, mode="comprehensiveness"))
        for m in ("contribution", "random")]

def once():
    counts = {{}}
    return [int(m.sum()) for _, m in job_masks(jobs, piece, "row", counts)]

"""


# the child's timing, after its once(): a warm-up, then --inner timed calls (CPU and wall)
TIMING = r"""
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

with torch.no_grad():
    once()
    cpu_s, wall_s = [], []
    for _ in range({inner}):
        c0, t0 = cpu(), time.perf_counter()
        once()
        cpu_s.append(cpu() - c0)
        wall_s.append(time.perf_counter() - t0)
print(json.dumps({{"cpu_s": cpu_s, "wall_s": wall_s}}))
"""


def run(tree: Path, args) -> dict:
    code = ((RANKING if args.what == "ranking" else CHILD) + TIMING).format(
        threads=args.threads, shape=args.shape, layers=args.layers, n=args.n, inner=args.inner)
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()), OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=tree).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", type=Path, help="checkout A (the baseline), e.g. a git worktree")
    ap.add_argument("b", type=Path, help="checkout B (the change)")
    ap.add_argument("--what", choices=["stream", "ranking"], default="stream",
                    help="stream: the streamed pass; ranking: the row masks of one lockstep "
                    "sub-block of 2^22 entries (job_masks: contribution and random, "
                    "comprehensiveness 0.1, the last rows of n keys, 9 heads)")
    ap.add_argument("--n", type=int, default=2048, help="tokens")
    ap.add_argument("--shape", default="smollm2-135m", help="random_init shape")
    ap.add_argument("--layers", type=int, default=4, help="layers of the random model")
    ap.add_argument("--rounds", type=int, default=4, help="A, B process pairs")
    ap.add_argument("--inner", type=int, default=2, help="timed passes per process")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    args = ap.parse_args()
    cpu: dict[str, list[float]] = {"A": [], "B": []}
    wall: dict[str, list[float]] = {"A": [], "B": []}
    ratios = []
    for i in range(args.rounds):
        med = {}
        for name, tree in (("A", args.a), ("B", args.b)) if i % 2 == 0 else (("B", args.b), ("A", args.a)):
            r = run(tree, args)
            cpu[name] += r["cpu_s"]
            wall[name] += r["wall_s"]
            med[name] = statistics.median(r["cpu_s"])
            print(f"round {i} {name}: cpu {' '.join(f'{x:.2f}' for x in r['cpu_s'])} s, "
                  f"wall {' '.join(f'{x:.2f}' for x in r['wall_s'])} s", flush=True)
        ratios.append(med["B"] / med["A"])
    a, b = statistics.median(cpu["A"]), statistics.median(cpu["B"])
    what = (f"{args.shape} ({args.layers} layers, random weights)" if args.what == "stream"
            else "row masks of one lockstep sub-block")
    print(f"{args.what}: n {args.n}, {what}, {args.threads} thread(s), "
          f"{args.rounds} rounds x {args.inner} passes")
    print(f"median CPU s: A {a:.2f}, B {b:.2f}; B / A {b / a:.3f} (per-round ratios "
          f"{min(ratios):.3f}-{max(ratios):.3f}); median wall s: A {statistics.median(wall['A']):.2f}, "
          f"B {statistics.median(wall['B']):.2f}")


if __name__ == "__main__":
    main()
