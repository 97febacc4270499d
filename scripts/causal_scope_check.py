"""Whole-continuation log-likelihood vs the sum of token-by-token ones under masking.

With causal scopes (the default) the two are equal in every scope; ``--non-causal``
rebuilds the earlier head/layer masks (thresholds from every row of the unit) to show
how far they read the future. One GSM8K-style text, 8 context tokens, the next 16 scored.

    python scripts/causal_scope_check.py head layer          # SmolLM2-135M, CPU
    python scripts/causal_scope_check.py head layer --non-causal

``--non-causal`` replaces the step that makes a head/layer ranking causal
(:func:`cwlens.faithfulness.causal_scope.causal_ranking`, called by
:mod:`cwlens.faithfulness.job_masks`, where every mask of the sweep and of the lm-eval
scoring is built) by the identity, and checks that the masks went through it: if the
masks were ever built elsewhere, the script stops instead of printing a difference of 0
(as it once did, patching a module the masks no longer used).
"""

import argparse
import contextlib

TEXT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many "
        "clips in May. How many clips did Natalia sell altogether in April and May?")


@contextlib.contextmanager
def leaking_masks():
    """The earlier head/layer masks (decided from every row of the unit) for the duration
    of the block; yields the list of rankings that went through the replaced step."""
    from cwlens.faithfulness import job_masks

    seen: list = []
    real = job_masks.causal_ranking

    def keep(ranking):
        seen.append(ranking.scope)
        return ranking

    job_masks.causal_ranking = keep
    try:
        yield seen
    finally:
        job_masks.causal_ranking = real


def check(model, scope: str, metric: str = "contribution", rate: float = 0.3,
          non_causal: bool = False, n_context: int = 8, n_scored: int = 16,
          text: str = TEXT) -> tuple[float, float]:
    """``(whole, token_by_token)`` log-likelihoods (nats) of the ``n_scored`` tokens after
    the first ``n_context`` of ``text``, comprehensiveness masking at ``rate`` by
    ``metric`` in ``scope``; ``non_causal``: with the earlier masks (:func:`leaking_masks`)."""
    from cwlens.engine.batching import token_ids
    from cwlens.engine.handle import wrap
    from cwlens.lmeval.requests import token_request
    from cwlens.lmeval.scoring import score_requests
    from cwlens.lmeval.settings import masking_config

    ids = token_ids(model, text).tolist()
    if len(ids) < n_context + n_scored:
        raise ValueError(f"the text has {len(ids)} tokens; {n_context} + {n_scored} are needed.")
    ctx, cont = ids[:n_context], ids[n_context:n_context + n_scored]
    cfg = masking_config(metric, "comprehensiveness", rate, scope=scope)
    handle = wrap(model)
    with leaking_masks() if non_causal else contextlib.nullcontext([]) as seen:
        whole = score_requests(handle, [token_request(ctx, cont, 2048)], [("whole",)], cfg)[0][0]
        steps = [token_request(ctx + cont[:t], cont[t:t + 1], 2048, item=t) for t in range(len(cont))]
        lls = score_requests(handle, steps, [("step", t) for t in range(len(cont))], cfg)
    if non_causal and scope != "row" and scope not in seen:
        raise RuntimeError(
            f"--non-causal did not reach the {scope}-scope masks: cwlens.faithfulness.job_masks no "
            "longer makes them causal through causal_ranking; update leaking_masks() to where "
            "it is done now.")
    return whole, sum(ll for ll, _ in lls)


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

    model = cwlens.load_model(args.model, device="cpu")
    for scope in args.scopes:
        whole, stepwise = check(model, scope, args.metric, args.rate, args.non_causal)
        print(f"{scope}: whole {whole:.4f}, token by token {stepwise:.4f}, "
              f"difference {whole - stepwise:+.4f} nats", flush=True)


if __name__ == "__main__":
    main()
