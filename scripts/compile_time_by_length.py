"""How long tracr takes, and how much memory, to compile a program at a given max_seq_len:
the measurement behind ``cwlens.groundtruth.compiler.MAX_SEQ_LEN`` (docs/groundtruth.md).
One program and length per process, so that the peak resident memory is that compile's
(jax's import alone holds about 0.7 GB). Needs the tracr extra.

    python scripts/compile_time_by_length.py reverse 32
    for n in 8 16 32 64; do timeout 300 python scripts/compile_time_by_length.py sort $n; done
"""

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROGRAMS = ("reverse", "sort", "hist", "prev_token")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("program", choices=PROGRAMS)
    parser.add_argument("max_seq_len", type=int)
    args = parser.parse_args()
    from tracr.compiler import lib
    from tracr.rasp import rasp

    from cwlens.groundtruth import compiler

    compiler.MAX_SEQ_LEN = max(compiler.MAX_SEQ_LEN, args.max_seq_len)  # measure past the limit
    n = args.max_seq_len
    program = {"reverse": lambda: lib.make_reverse(rasp.tokens),
               "sort": lambda: lib.make_sort(rasp.tokens, rasp.tokens, max_seq_len=n, min_key=1),
               "hist": lib.make_hist, "prev_token": lambda: lib.shift_by(1, rasp.tokens)}[args.program]()
    vocab = {1, 2, 3, 4} if args.program == "sort" else {"a", "b", "c", "d"}
    start = time.perf_counter()
    compiler.compile_program(program, vocab, n)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.program} max_seq_len={n}: {seconds:.1f} s, peak RSS {peak:.0f} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
