"""Per-text comparison of two `cwlens groundtruth --edges` run folders of the same model and
data: each text's clean objective and each method's Spearman of magnitudes (mean over the
text's layers), A -> B, for the texts both folders hold.

    python scripts/compare_edge_runs.py runs/edges/qwen_gsm8k_f32lse runs/edges/qwen_gsm8k
"""

import argparse
import glob
import json
import sys

import numpy as np

METHODS = ("value_weighted", "attention", "contribution")


def per_text(folder: str) -> dict:
    out = {}
    for path in sorted(glob.glob(f"{folder}/inputs/*.json")):
        with open(path) as f:
            r = json.load(f)
        out[r["id"]] = (r["clean"], {m: float(np.nanmean([x["methods"][m]["spearman_abs"] for x in r["layers"]]))
                                     for m in METHODS})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("a", help="a run folder (--out of cwlens groundtruth --edges)")
    parser.add_argument("b", help="the other run folder")
    args = parser.parse_args(argv)
    a, b = per_text(args.a), per_text(args.b)
    shared = sorted(set(a) & set(b))
    if not shared:
        parser.error(f"no text is in both {args.a}/inputs and {args.b}/inputs")
    print("| text | clean A | clean B | " + " | ".join(f"{m} A -> B" for m in METHODS) + " |")
    print("|---|---|---|" + "---|" * len(METHODS))
    for k in shared:
        (ca, va), (cb, vb) = a[k], b[k]
        cells = " | ".join(f"{va[m]:.3f} -> {vb[m]:.3f}" for m in METHODS)
        print(f"| {k} | {ca:.3g} | {cb:.3g} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
