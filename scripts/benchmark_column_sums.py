"""Column sums of the streamed pass's four metrics on one block, old against new, alternated
in one process (CPU time, median of 12 runs each): summing each measure's
``[batch, head, query, key]`` tensor (old) against the attention baselines' sums read from
the block's pattern (``reducers._pattern_column_sums``, new); then all eight reducers of
``scripts/benchmark.py --stream`` (top-8 and column sums of contribution and the three
baselines) with their measures, old against new. One causal block of the last 256 queries
of 2048 keys, SmolLM2's shape (9 heads, 3 kv heads), random values.

    OMP_NUM_THREADS=1 python scripts/benchmark_column_sums.py
"""

import statistics
import time

import torch

from cwlens.core.geometry import AttentionGeometry
from cwlens.engine import reducers as R
from cwlens.engine.streaming import BlockMeasures

METRICS = ("contribution", "attention", "value_weighted", "value_weighted_output_normalized")


def block_inputs(n: int = 2048, q: int = 256, heads: int = 9, kv: int = 3, d: int = 64, dm: int = 576):
    g = torch.Generator().manual_seed(0)
    v = torch.randn(1, n, kv, d, generator=g)
    w_o = torch.randn(heads, d, dm, generator=g) / 8
    base = AttentionGeometry(torch.zeros(1, heads, 1, n), v, w_o)
    start = n - q
    later = torch.arange(n)[None, :] > torch.arange(start, n)[:, None]
    pattern = torch.randn(1, heads, q, n, generator=g).masked_fill(later, -float("inf")).softmax(-1)
    return base, pattern, start, n


def column_sums(base, pattern, start, n, new: bool):
    block = base.with_rows(pattern, start)
    w = BlockMeasures(block, "inter", n, True)
    for m in ("contribution", "attention", "value_weighted"):
        w[m]  # what the TopK reducers materialise anyway
    t0 = time.process_time()
    out = []
    for m in METRICS:
        x = R._pattern_column_sums(w, m) if new else None
        out.append(w[m].sum(2) if x is None else x)
    return time.process_time() - t0, out


def all_reducers(base, pattern, start, n, new: bool) -> float:
    block = base.with_rows(pattern, start)
    w = BlockMeasures(block, "inter", n, True)
    rs = [R.TopK(8, m) for m in METRICS] + [R.ColumnSums(m) for m in METRICS]
    for r in rs:
        r.reset()
    saved = R._pattern_column_sums
    if not new:
        R._pattern_column_sums = lambda *a: None  # type: ignore[assignment]
    t0 = time.process_time()
    try:
        for r in rs:
            r.update(0, start, w, block)
    finally:
        R._pattern_column_sums = saved
    return time.process_time() - t0


def interleaved(fn, repeats: int = 12) -> dict:
    times: dict = {True: [], False: []}
    for i in range(repeats):
        for new in ((False, True) if i % 2 else (True, False)):
            times[new].append(fn(new))
    return times


def main() -> None:
    torch.set_num_threads(1)
    args = block_inputs()
    _, old = column_sums(*args, new=False)
    _, new = column_sums(*args, new=True)
    for a, b in zip(old, new, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for label, fn in (("column sums of the 4 metrics", lambda nw: column_sums(*args, new=nw)[0]),
                      ("all 8 reducers with their measures", lambda nw: all_reducers(*args, new=nw))):
        t = interleaved(fn)
        o, w = statistics.median(t[False]), statistics.median(t[True])
        print(f"{label}, one [1, 9, 256, 2048] block: old {o * 1e3:.1f} ms "
              f"({min(t[False]) * 1e3:.1f}-{max(t[False]) * 1e3:.1f}), new {w * 1e3:.1f} ms "
              f"({min(t[True]) * 1e3:.1f}-{max(t[True]) * 1e3:.1f}); new / old {w / o:.2f}")


if __name__ == "__main__":
    main()
