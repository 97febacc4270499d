"""Encoder faithfulness on all-MiniLM-L6-v2: 1 - cos of the mean-pooled sentence embedding
when the top- (comprehensiveness) or bottom-ranked (sufficiency) entries are removed,
per metric, on shipped FineWeb-Edu sentences; AOPC over the rates and paired bootstrap
differences against the contribution weights.

    python scripts/encoder_faithfulness.py --sentences 64 --rates 0.01,0.05,0.1,0.3,0.5
"""

import argparse
import json
import time

import numpy as np
import pandas as pd

import cwlens
from cwlens.core.bootstrap import (
    FLAG,
    bootstrap_ci,
    flag_note,
    outside_validity,
    paired_bootstrap,
    sample_skewness,
)
from cwlens.core.metrics import REGISTRY
from cwlens.faithfulness import aopc as A
from cwlens.faithfulness.encoder import embedding_damage, sentences

METRICS = ("attention", "value_weighted", "value_weighted_output_normalized", "contribution",
           "contribution_abs", "alti", "random")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--rates", default="0.01,0.05,0.1,0.3,0.5")
    ap.add_argument("--dataset", default="fineweb_edu")
    ap.add_argument("--json", default=None, help="also write the per-sample rows here")
    args = ap.parse_args()
    rates = tuple(float(r) for r in args.rates.split(","))
    model = cwlens.load_model("all-minilm-l6-v2", device="cpu")
    texts = sentences(args.dataset, args.sentences)
    t = time.perf_counter()
    rows = embedding_damage(model, texts, METRICS, rates)
    print(f"all-MiniLM-L6-v2, {len(texts)} {args.dataset} sentences, {time.perf_counter() - t:.0f} s; "
          "damage = 1 - cos(masked, clean) of the mean-pooled embedding, mean [95% CI]\n")
    damage = A.damages(pd.DataFrame(rows).assign(measure="embedding_damage",
                                                 value=lambda f: f["damage"]), "embedding_damage")
    per_sample = A.aopc(damage, rates).set_index(["metric", "mode", "sample_id"])["aopc"].sort_index()
    curves = A.curve_summary(damage).set_index(["metric", "mode", "rate"])["mean"]
    flagged = 0
    for mode in ("comprehensiveness", "sufficiency"):
        print(f"**{mode}** ({'more' if mode == 'comprehensiveness' else 'less'} damage = more faithful)\n")
        print("| metric | " + " | ".join(f"{r:g}" for r in rates) + " | AOPC | AOPC − contrib [95% paired CI] |")
        print("|---" * (len(rates) + 3) + "|")
        ref = per_sample.loc["contribution", mode]
        for m in METRICS:
            cells = [f"{curves.loc[m, mode, r]:.4f}" for r in rates]
            a = per_sample.loc[m, mode].loc[ref.index]
            lo, hi = bootstrap_ci(a.to_numpy())
            d = paired_bootstrap(ref.to_numpy(), a.to_numpy())
            diff = "—" if m == "contribution" else f"{d.mean:+.4f} [{d.low:+.4f}, {d.high:+.4f}]"
            diff += FLAG if m != "contribution" and d.flagged else ""
            flag = FLAG if outside_validity(len(a), sample_skewness(a.to_numpy())) else ""
            flagged += bool(flag) or diff.endswith(FLAG)
            print(f"| {REGISTRY[m].short} | " + " | ".join(cells)
                  + f" | {np.mean(a):.4f} [{lo:.4f}, {hi:.4f}]{flag} | {diff} |")
        print()
    if flagged:
        print(flag_note(len(ref)) + "\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
