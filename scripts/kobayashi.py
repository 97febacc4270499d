"""Kobayashi et al. (2020) on a real model: [CLS], [SEP] and punctuation receive much
attention but carry little norm-weighted contribution. Per layer and token class:
attention share, norm-weighted share (sum ||a v~|| over the class / over the row),
signed and |.| contribution shares, the uniform baseline (key_frac), and the factor split
c = a * (||v~|| / ||o||) * cos(o, v~) averaged per key of the class
(cwlens.sinks.token_classes). Texts: shipped FineWeb-Edu sentences.

    OMP_NUM_THREADS=1 python scripts/kobayashi.py --sentences 64
    OMP_NUM_THREADS=1 python scripts/kobayashi.py --sentences 64 --model smollm2-135m

--per-sentence also runs each sentence alone and gives, per class, the mean over sentences
of (attention - norm-weighted share) averaged over layers, its 95% bootstrap interval, and
in how many sentences attention exceeds the norm-weighted share.
"""

import argparse
import json
import time

import numpy as np

import cwlens
from cwlens.core.bootstrap import FLAG, bootstrap_ci, flag_note, outside_validity, sample_skewness
from cwlens.faithfulness.encoder import sentences
from cwlens.sinks.token_classes import CLASSES, COLUMNS, class_shares, format_summary, summary


def markdown(df) -> str:
    cols = [c for c in COLUMNS if c != "n_keys"]
    lines = ["| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
    for r in df.itertuples():
        cells = [str(r.layer), r.token_class] + [f"{getattr(r, c):.3f}" for c in cols[2:]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_sentence(model, texts, args) -> None:
    diffs: dict[str, list[float]] = {c: [] for c in CLASSES}
    for _, text in texts:
        df = class_shares(model, [text], max_tokens=args.max_tokens, kind=args.kind)
        means = df.groupby("token_class")[["attention", "norm_weighted", "n_keys"]].mean()
        for c in CLASSES:
            if means.loc[c, "n_keys"] > 0:
                diffs[c].append(float(means.loc[c, "attention"] - means.loc[c, "norm_weighted"]))
    print("\nper sentence (each run alone), attention - norm-weighted share, mean over layers:")
    for c in CLASSES:
        d = np.array(diffs[c])
        if len(d) == 0:
            print(f"  {c}: no tokens of this class")
            continue
        lo, hi = bootstrap_ci(list(d))
        flag = f" {FLAG} {flag_note(len(d))}" if outside_validity(len(d), sample_skewness(d)) else ""
        print(f"  {c}: {d.mean():+.3f} [95% CI {lo:+.3f}, {hi:+.3f}]; attention > norm-weighted "
              f"in {(d > 0).sum()}/{len(d)} sentences{flag}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", type=int, default=64)
    ap.add_argument("--model", default="all-minilm-l6-v2")
    ap.add_argument("--dataset", default="fineweb_edu")
    ap.add_argument("--kind", default="inter", choices=("inter", "intra"))
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--per-sentence", action="store_true",
                    help="also the per-sentence differences with bootstrap intervals")
    ap.add_argument("--json", default=None, help="also write the table and the summary here")
    args = ap.parse_args()
    model = cwlens.load_model(args.model, device="cpu")
    texts = sentences(args.dataset, args.sentences)
    t = time.perf_counter()
    df = class_shares(model, texts, max_tokens=args.max_tokens, batch_size=args.batch_size,
                      kind=args.kind)
    d = summary(df)
    print(f"{args.model}, {len(texts)} {args.dataset} sentences, kind={args.kind}, "
          f"{time.perf_counter() - t:.0f} s\n")
    print(markdown(df))
    print()
    print(format_summary(d))
    print("\nper layer (attention / norm-weighted / |contribution|):")
    for name in CLASSES[:3]:
        per = d["layers"][name]
        if d["classes"][name]["n_keys"] == 0:
            print(f"  {name}: no tokens of this class")
            continue
        cells = [f"L{ly}: {a:.3f}/{n:.3f}/{c:.3f}" for ly, (a, n, c) in enumerate(
            zip(per["attention"], per["norm_weighted"], per["contribution_abs"], strict=True))]
        print(f"  {name}: " + "  ".join(cells))
    if args.per_sentence:
        per_sentence(model, texts, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": df.to_dict("records"), "summary": d}, f, indent=1)


if __name__ == "__main__":
    main()
