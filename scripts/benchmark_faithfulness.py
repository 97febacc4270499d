"""Cost of the faithfulness sweep against the model's own forward pass.

Prints ``ratio = wall time / (forward passes run x one plain forward pass)`` for a small
sweep (goal <= 1.2: ranking, mask building and scoring must cost less than 20% on top
of the model). "One plain forward" is ``model(tokens, attention_mask)`` on the sweep's
own batches, without hooks, timed first (median of --repeats).

    python scripts/benchmark_faithfulness.py                         # SmolLM2, CPU
    python scripts/benchmark_faithfulness.py --dataset fineweb_edu --samples 8 --max-tokens 256
"""

import argparse
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dataset", default="gsm8k")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--rates", default="0.1,0.3")
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()

    import cwlens
    from cwlens.batching import pad_batch
    from cwlens.datasets import load_dataset
    from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
    from cwlens.faithfulness.sweep import _text_units, plan_batches

    model = cwlens.load_model(args.model, device=args.device)
    cfg = FaithfulnessConfig(
        rates=tuple(float(r) for r in args.rates.split(",")),
        max_tokens=args.max_tokens, batch_tokens=args.batch_tokens,
    )
    samples = load_dataset(args.dataset, args.samples)
    units = _text_units(model, samples, cfg.max_tokens)
    batches = [pad_batch(model, [s for u in b for s in units[u].sequences])
               for b in plan_batches(units, cfg.batch_tokens)]
    with torch.no_grad():
        model(*batches[0][:1], attention_mask=batches[0][1])  # warm-up
        runs = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            for tokens, mask in batches:
                model(tokens, attention_mask=mask)
            runs.append(time.perf_counter() - t)
    one_pass = statistics.median(runs)  # one plain forward over every batch
    result = run_faithfulness(model, samples, cfg, progress=False)
    s = result.stats
    passes_per_batch = s.n_forwards / s.n_batches
    ratio = s.wall_seconds / (passes_per_batch * one_pass)
    print(
        f"faithfulness sweep: {args.dataset} n={args.samples} max_tokens={args.max_tokens} "
        f"{len(cfg.metrics)} metrics x {len(cfg.modes)} modes x {len(cfg.rates)} rates, "
        f"{s.n_batches} batches, {s.n_forwards} forward passes "
        f"({passes_per_batch:.1f}/batch; identical masks shared); one plain pass over all "
        f"batches {one_pass:.2f}s; wall {s.wall_seconds:.1f}s (forwards {s.forward_seconds:.1f}s, "
        f"ranking {s.ranking_seconds:.1f}s); ratio wall/(passes x forward) = {ratio:.2f} "
        f"(goal <= 1.2)"
    )


if __name__ == "__main__":
    main()
