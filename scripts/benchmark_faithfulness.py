"""Cost of the faithfulness sweep against the model's own forward pass.

Prints ``ratio = wall time / (forward passes run x one plain forward pass)`` for a small
sweep (goal <= 1.2: ranking, mask building and scoring must cost less than 20% on top
of the model). "One plain forward" is ``model(tokens, attention_mask)`` on the sweep's
own batches, without hooks, timed --repeats times before the sweep and --repeats times
after it (the median of all: a machine that slows down or speeds up during the sweep
moves both terms alike).

    python scripts/benchmark_faithfulness.py                         # SmolLM2, CPU
    python scripts/benchmark_faithfulness.py --dataset fineweb_edu --samples 8 --max-tokens 256

``--nproc N``: the speed-up of a torchrun job of N processes over one process, from one
invocation: the same sweep (same samples, same batches) runs as one process and as
``torchrun --standalone --nproc-per-node=N``, alternately ``--repeats`` times, every
process with ONE thread (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``), each
writing its results to a fresh folder; it prints the sweep time (model loaded, from a
barrier to the merged file) and the whole command's time (start-up and model load
included), their medians and ratios, the CPU time of the sweep over all processes (CPU
time / sweep time = the cores the processes actually got: on a shared machine fewer than
N), and whether the two runs wrote identical files.

    python scripts/benchmark_faithfulness.py --nproc 2 --samples 8 --max-tokens 128 --batch-tokens 256
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def _config(args):
    from cwlens.faithfulness import FaithfulnessConfig

    return FaithfulnessConfig(
        rates=tuple(float(r) for r in args.rates.split(",")),
        max_tokens=args.max_tokens, batch_tokens=args.batch_tokens,
    )


def worker(args) -> None:
    """One process of the ``--nproc`` comparison (under torchrun or alone)."""
    torch.set_num_threads(1)
    import cwlens
    from cwlens.datasets import load_dataset
    from cwlens.faithfulness import run_faithfulness
    from cwlens.runs import distributed

    with distributed.session() as world:
        model = cwlens.load_model(args.model, device=args.device)
        samples = load_dataset(args.dataset, args.samples)
        distributed.barrier()  # every rank has its model
        t, cpu = time.perf_counter(), time.process_time()
        result = run_faithfulness(model, samples, _config(args), out=Path(args.worker) / "results.jsonl",
                                  progress=False)
        seconds = time.perf_counter() - t  # run_faithfulness ends after the merge, on every rank
        cpu_s = sum(distributed.gather(time.process_time() - cpu))  # CPU seconds, all ranks
        if world.main:
            s = result.stats
            print("RESULT " + json.dumps({"nproc": world.size, "sweep_s": seconds, "cpu_s": cpu_s,
                                          "n_batches": s.n_batches, "n_forwards": s.n_forwards}))


def compare(args) -> None:
    """Run the sweep as one process and as N, alternately; print the speed-up."""
    script = str(Path(__file__).resolve())
    passed = ["--model", args.model, "--device", args.device, "--dataset", args.dataset,
              "--samples", str(args.samples), "--max-tokens", str(args.max_tokens),
              "--rates", args.rates, "--batch-tokens", str(args.batch_tokens)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    launch = {1: [sys.executable, script],
              args.nproc: [sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={args.nproc}", script]}
    runs: dict[int, list[dict]] = {1: [], args.nproc: []}
    files: set[bytes] = set()
    with tempfile.TemporaryDirectory(prefix="cwlens-bench-") as tmp:
        for r in range(args.repeats):
            for n in (1, args.nproc):
                folder = Path(tmp) / f"n{n}-r{r}"
                t = time.perf_counter()
                proc = subprocess.run([*launch[n], *passed, "--worker", str(folder)], env=env,
                                      capture_output=True, text=True)
                total = time.perf_counter() - t
                if proc.returncode != 0:
                    sys.exit(f"the {n}-process run failed:\n{proc.stderr[-3000:]}")
                line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
                runs[n].append({**json.loads(line[7:]), "total_s": total})
                files.add((folder / "results.jsonl").read_bytes())
    one = runs[1]
    med = {n: {k: statistics.median(x[k] for x in runs[n]) for k in ("sweep_s", "total_s", "cpu_s")}
           for n in runs}
    for n, rs in runs.items():
        print(json.dumps({"nproc": n, "threads_per_process": 1, "n_batches": rs[0]["n_batches"],
                          "n_forwards": rs[0]["n_forwards"], "sweep_s": [round(x["sweep_s"], 2) for x in rs],
                          "total_s": [round(x["total_s"], 2) for x in rs],
                          "cpu_s": [round(x["cpu_s"], 2) for x in rs]}))
    batches = one[0]["n_batches"]
    print(f"faithfulness sweep, {args.dataset} n={args.samples} max_tokens={args.max_tokens}, "
          f"{batches} batches, one thread per process, {args.repeats} alternating repeats (medians):")
    for n in (1, args.nproc):
        m = med[n]
        print(f"  {n} process{'es' if n > 1 else ''}: sweep {m['sweep_s']:.1f}s, whole command "
              f"{m['total_s']:.1f}s; sweep CPU time {m['cpu_s']:.1f}s over all processes = "
              f"{m['cpu_s'] / m['sweep_s']:.2f} cores busy on average")
    print(f"  speed-up over one process: sweep {med[1]['sweep_s'] / med[args.nproc]['sweep_s']:.2f}x, "
          f"whole command {med[1]['total_s'] / med[args.nproc]['total_s']:.2f}x "
          f"(ideal {args.nproc}x; batches are whole units: {batches} batches over {args.nproc} processes)")
    print(f"  identical result files (every run): {len(files) == 1}")
    print(f"  (a speed-up below {args.nproc}x with about as much CPU time in both runs means the "
          "processes did not get a core each: other load on the machine)")
    if batches < 2 * args.nproc:
        print(f"  note: only {batches} batches for {args.nproc} processes; lower --batch-tokens "
              "or raise --samples for a fair split")


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
    p.add_argument("--nproc", type=int, default=None,
                   help="compare one process with a torchrun job of N processes (one thread each)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: one run of --nproc
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.nproc:
        if args.nproc < 2:
            sys.exit("--nproc must be at least 2")
        return compare(args)

    import cwlens
    from cwlens.datasets import load_dataset
    from cwlens.engine.batching import pad_batch
    from cwlens.faithfulness import run_faithfulness
    from cwlens.faithfulness.units import plan_batches, text_units

    model = cwlens.load_model(args.model, device=args.device)
    cfg = _config(args)
    samples = load_dataset(args.dataset, args.samples)
    units = text_units(cwlens.wrap(model), samples, cfg.max_tokens)
    batches = [pad_batch(model, [s for u in b for s in units[u].sequences])
               for b in plan_batches(units, cfg.batch_tokens)]

    def plain_passes() -> list[float]:
        runs = []
        with torch.no_grad():
            for _ in range(args.repeats):
                t = time.perf_counter()
                for tokens, mask in batches:
                    model(tokens, attention_mask=mask)
                runs.append(time.perf_counter() - t)
        return runs

    with torch.no_grad():
        model(*batches[0][:1], attention_mask=batches[0][1])  # warm-up
    before = plain_passes()
    result = run_faithfulness(model, samples, cfg, progress=False)
    after = plain_passes()  # timed on both sides of the sweep: a machine that slows or
    one_pass = statistics.median(before + after)  # speeds up meanwhile moves both terms alike
    s = result.stats
    passes_per_batch = s.n_forwards / s.n_batches
    ratio = s.wall_seconds / (passes_per_batch * one_pass)
    print(
        f"faithfulness sweep: {args.dataset} n={args.samples} max_tokens={args.max_tokens} "
        f"{len(cfg.metrics)} metrics x {len(cfg.modes)} modes x {len(cfg.rates)} rates, "
        f"{s.n_batches} batches, {s.n_forwards} forward passes "
        f"({passes_per_batch:.1f}/batch; identical masks shared); one plain pass over all "
        f"batches {one_pass:.2f}s (median of {len(before)} before and {len(after)} after the sweep: "
        f"{', '.join(f'{x:.2f}' for x in before + after)}s); wall {s.wall_seconds:.1f}s (forwards {s.forward_seconds:.1f}s, "
        f"ranking {s.ranking_seconds:.1f}s); ratio wall/(passes x forward) = {ratio:.2f} "
        f"(goal <= 1.2)"
    )
    # the ratio's two factors: what the sweep adds to its own forward passes (ranking, mask
    # building, scoring: no plain-pass timing in it, so steady on a noisy machine), and its
    # forward passes against plain ones (hooks, masking; carries the plain pass's noise)
    per_pass = s.forward_seconds / s.n_forwards
    print(f"  = wall/forwards {s.wall_seconds / s.forward_seconds:.3f} (the sweep's own cost on top "
          f"of its passes) x forwards/(passes x plain) {per_pass / one_pass:.3f} "
          f"({per_pass:.2f}s a pass against {one_pass:.2f}s plain)")


if __name__ == "__main__":
    main()
