"""How many prompts make `cwlens circuits`' agreement figures meaningful.

Scores every head and patches it on a pool of prompts, one prompt at a time
(:func:`cwlens.circuits.noise.prompt_scores`), then splits the pool many times into two
disjoint runs of n prompts and recomputes each score's agreement with patching on both
(:func:`~cwlens.circuits.noise.agreement_noise`). Prints, per task and n, the standard
deviation of one run's all-heads Spearman (and of the top-k figures), and the fewest
prompts at which every score's Spearman has an SD of at most 0.05
(:data:`cwlens.circuits.noise.NOISE_SD`): the thresholds of
:data:`cwlens.circuits.noise.MIN_PROMPTS` and docs/circuits.md ("How many prompts")::

    python scripts/circuits_noise.py --tasks ioi --pool 48 --sizes 2,4,8,16,24
    python scripts/circuits_noise.py --tasks induction --pool 32 --sizes 2,4,8,16
"""

import argparse
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tasks", default="ioi,induction")
    p.add_argument("--pool", type=int, default=48, help="prompts in the pool (default: %(default)s)")
    p.add_argument("--sizes", default="2,4,8,16,24", help="prompts per run, two disjoint runs per draw (default: %(default)s)")
    p.add_argument("--draws", type=int, default=200, help="sets drawn per size (default: %(default)s)")
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--csv", default=None, help="write the full table here")
    args = p.parse_args(argv)

    import pandas as pd
    import torch

    import cwlens
    from cwlens import circuits
    from cwlens.circuits.noise import NOISE_SD, agreement_noise, min_prompts, prompt_scores

    torch.manual_seed(0)
    model = cwlens.load_model(args.model, device="cpu")
    sizes = [int(s) for s in args.sizes.split(",")]
    tables = []
    for name in args.tasks.split(","):
        t0 = time.time()
        task = circuits.build_task(name, model, n_prompts=args.pool, seed=args.seed)
        per = prompt_scores(model, task)
        t1 = time.time()
        noise = agreement_noise(per, [n for n in sizes if 2 * n <= task.n_prompts], args.draws,
                                args.k, args.seed)
        noise.insert(0, "task", name)
        tables.append(noise)
        print(f"\n{name}: pool of {task.n_prompts} prompts (scored and patched in {t1 - t0:.0f} s), "
              f"{args.draws} splits into two runs per size ({time.time() - t1:.0f} s)")
        for stat in ("spearman", "spearman_top", "top_k_overlap"):
            wide = noise[noise.statistic == stat].pivot(index="score", columns="n", values="sd")
            pool = noise[noise.statistic == stat].groupby("score")["pool"].first()
            print(f"  SD of one run's {stat}, by prompts per run (the pool's value at the end):")
            for score, row in wide.iterrows():
                print(f"    {score:<20}" + "".join(f"{v:>8.3f}" for v in row) + f"   pool {pool[score]:+.2f}")
            print("    " + " " * 20 + "".join(f"{'n=' + str(n):>8}" for n in wide.columns))
        need = min_prompts(noise, "spearman", NOISE_SD)
        print(f"  fewest prompts with every score's Spearman SD <= {NOISE_SD}: "
              + (str(need) if need is not None else f"more than {max(sizes)}"))
    if args.csv:
        pd.concat(tables).to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
