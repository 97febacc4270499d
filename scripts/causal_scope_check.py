"""Whole-continuation log-likelihood vs the sum of token-by-token ones under masking.

With causal scopes (the default) the two are equal in every scope; ``--non-causal``
rebuilds the earlier head/layer masks (thresholds from every row of the unit) to show
how far they read the future. One GSM8K-style text, 8 context tokens, the next 16 scored.

    python scripts/causal_scope_check.py head layer          # SmolLM2-135M, CPU
    python scripts/causal_scope_check.py head --non-causal
"""

import argparse


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scopes", nargs="+", choices=("row", "head", "layer"))
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--metric", default="contribution")
    p.add_argument("--rate", type=float, default=0.3)
    p.add_argument("--non-causal", action="store_true",
                   help="the earlier head/layer masks (decided from every row)")
    args = p.parse_args(argv)

    import cwlens
    import cwlens.faithfulness.sweep as sweep
    from cwlens.engine.batching import token_ids
    from cwlens.lmeval.requests import token_request
    from cwlens.lmeval.scoring import score_requests
    from cwlens.lmeval.settings import masking_config

    if args.non_causal:
        sweep.causal_ranking = lambda ranking: ranking  # diagnostic only: the old masks
    model = cwlens.load_model(args.model, device="cpu")
    text = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many "
            "clips in May. How many clips did Natalia sell altogether in April and May?")
    ids = token_ids(model, text).tolist()
    ctx, cont = ids[:8], ids[8:24]
    for scope in args.scopes:
        cfg = masking_config(args.metric, "comprehensiveness", args.rate, scope=scope)
        whole = score_requests(model, [token_request(ctx, cont, 2048)], [("whole",)], cfg)[0][0]
        steps = [token_request(ctx + cont[:t], cont[t:t + 1], 2048, item=t) for t in range(len(cont))]
        lls = score_requests(model, steps, [("step", t) for t in range(len(cont))], cfg)
        stepwise = sum(ll for ll, _ in lls)
        print(f"{scope}: whole {whole:.4f}, token by token {stepwise:.4f}, "
              f"difference {whole - stepwise:+.4f} nats", flush=True)


if __name__ == "__main__":
    main()
