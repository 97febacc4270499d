"""The movement truth (b) agrees with value-weighted attention by construction: per
shipped program, over its shipped inputs (``sample_inputs(256, seed=0)``, no tracr
needed), how far ``a_ij ||v~_j||`` separates the movement set from every other entry
(:func:`cwlens.groundtruth.construction.separation`). docs/groundtruth.md cites its table.

    python scripts/movement_by_construction.py [--inputs 256]
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cwlens.groundtruth import library  # noqa: E402
from cwlens.groundtruth.construction import separation  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=256, help="inputs per program (default: 256)")
    args = parser.parse_args()
    start = time.perf_counter()
    print("| program | inputs | moved entries above every other | support above 1e-4 = movement "
          "| worst leak / smallest move | max \\|a - 1/\\|selected\\|\\| |")
    print("|---|---|---|---|---|---|")
    totals = [0, 0, 0]
    for name in library.names():
        s = separation(library.load(name), args.inputs, 0)
        totals = [totals[0] + s.n_inputs, totals[1] + s.separated, totals[2] + s.exact_support]
        print(f"| {s.program} | {s.n_inputs} | {s.separated} | {s.exact_support} | "
              f"{s.worst_ratio:.1e} | {'-' if s.attention_error != s.attention_error else f'{s.attention_error:.1e}'} |")
    print(f"| all | {totals[0]} | {totals[1]} | {totals[2]} | | |")
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
