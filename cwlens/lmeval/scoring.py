"""Score token requests clean or masked, with the faithfulness sweep's own batch step.

Per batch (:func:`cwlens.faithfulness.units.plan_batches`, ``cfg.batch_tokens`` padded
tokens): one clean forward pass on the streaming engine ranks every layer's entries by
``cfg``'s metric and keeps the mask bit-packed, then one ``run_masked`` pass scores the
requests with those entries removed (:func:`cwlens.faithfulness.passes.batch_outputs`,
the function ``run_faithfulness`` runs). Masks are built on, and applied to, each
input sequence as a whole -- the context and the continuation tokens it reads; head and
layer scopes are causal (the mask at query ``i`` from rows ``<= i``,
:mod:`cwlens.faithfulness.causal_scope`), so a continuation scored whole gets the
log-likelihood it gets token by token. At rate 0
(metric ``none``) the clean pass's logits are the scores.
"""

from collections.abc import Sequence

from tqdm.auto import tqdm

from cwlens.engine.handle import ModelHandle
from cwlens.faithfulness.causal_scope import require_causal
from cwlens.faithfulness.config import FaithfulnessConfig
from cwlens.faithfulness.passes import SweepStats, batch_outputs
from cwlens.faithfulness.units import plan_batches
from cwlens.lmeval.requests import group_units


def score_requests(
    handle: ModelHandle,
    requests: Sequence,
    groups: Sequence[object],
    cfg: FaithfulnessConfig,
    progress: bool = False,
    stats: SweepStats | None = None,
) -> list[tuple[float, bool]]:
    """``[(ll, is_greedy)]`` per request, in the order given.

    ``requests``: :class:`~cwlens.faithfulness.choice.ChoiceRequest` s
    (:func:`~cwlens.lmeval.requests.token_request`); ``groups``: one hashable per request,
    equal for the requests of one document (they share a unit, as in the sweep).
    """
    require_causal(cfg.scope, cfg.causal_only, "lm-eval log-likelihoods")
    if not requests:
        return []
    units, where = group_units(requests, groups)
    conditions = cfg.conditions(handle.n_layers)
    if len(conditions) != 1:
        raise ValueError(f"score_requests takes one masking condition; got {len(conditions)}.")
    key = conditions[0]
    stats = stats if stats is not None else SweepStats()
    scores: list = [None] * len(units)
    batches = plan_batches(units, cfg.batch_tokens)
    bar = None
    if progress:
        bar = tqdm(total=len(units), desc="cwlens-masked", unit="doc")
    for batch in batches:
        results = batch_outputs(handle, units, batch, cfg, conditions, stats)
        stats.n_batches += 1
        for pos, u in enumerate(batch):
            scores[u] = results[key][pos]
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    return [(scores[u]["ll"][k], scores[u]["greedy"][k]) for u, k in where]
