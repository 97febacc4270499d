"""How much the token-flow rule matters, and what the IOI corruption does to the metric.

For the IOI prompts of ``cwlens circuits --task ioi`` (8 prompts, seed 0) it prints:

- the task metric logit(IO) - logit(S) on the clean prompts and on each corruption
  (``abc``: three random names, Wang et al.; ``swap``: the second subject becomes the IO);
- per prompt, the final-layer input attribution into the last position
  (``TokenFlow.input_attribution(-1)``) under ``rule="signed"`` and ``rule="projection"``:
  their L1 distance, the overlap of their top-5 tokens (by |share|), and the first
  token's share under each.

    python scripts/flow_rules.py                       # SmolLM2-135M, CPU, ~1 min
    python scripts/flow_rules.py --model gpt2 --prompts 4
"""

import argparse

import torch


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    import cwlens
    from cwlens import circuits

    model = cwlens.load_model(args.model, device="cpu")
    tasks = {c: circuits.build_task("ioi", model, n_prompts=args.prompts, seed=args.seed, corruption=c)
             for c in ("abc", "swap")}
    with torch.no_grad():
        clean = tasks["abc"].metric(model(tasks["abc"].clean))
        print(f"IOI metric logit(IO) - logit(S), {len(clean)} prompts: clean {clean.mean():+.2f}", end="")
        for name, task in tasks.items():
            print(f"; corrupted ({name}) {task.metric(model(task.corrupted)).mean():+.2f}", end="")
    print()

    rules = ("signed", "projection")
    l1s, overlaps = [], []
    for b in range(len(clean)):
        tokens = tasks["abc"].clean[b : b + 1]
        _, cache = circuits.run_with_cache(model, tokens)
        words = model.to_str_tokens(tokens[0])
        att = {r: circuits.token_flow(cache, model, rule=r, str_tokens=words).input_attribution(-1)
               for r in rules}
        top = {r: set(att[r].abs().argsort(descending=True)[:5].tolist()) for r in rules}
        l1 = float((att["signed"] - att["projection"]).abs().sum())
        overlap = len(top["signed"] & top["projection"])
        l1s.append(l1)
        overlaps.append(overlap)
        print(f"prompt {b}: L1 {l1:.3f}, top-5 overlap {overlap}/5, first token "
              f"{float(att['signed'][0]):+.3f} (signed) vs {float(att['projection'][0]):+.3f} "
              f"(projection); top-5 projection: "
              + ", ".join(f"{words[j]!r} {float(att['projection'][j]):+.2f}"
                          for j in att["projection"].abs().argsort(descending=True)[:5].tolist()))
    print(f"mean L1 {sum(l1s) / len(l1s):.3f} (min {min(l1s):.3f}, max {max(l1s):.3f}); "
          f"top-5 identical in {sum(o == 5 for o in overlaps)} of {len(overlaps)} prompts, "
          f"mean overlap {sum(overlaps) / len(overlaps):.1f}/5")


if __name__ == "__main__":
    main()
