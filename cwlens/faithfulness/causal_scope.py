"""Causal head and layer scopes: the mask for query ``i`` decided from rows ``<= i`` only.

A head-scope (or layer-scope) ranking of :func:`~cwlens.faithfulness.ranking.rank_entries`
takes ``round(r * n)`` entries of the whole unit, so whether an entry of row ``i`` is
masked depends on the scores of later rows -- which, in a decoder, are computed from
later tokens, including the ones the model is scored on. A whole-continuation
log-likelihood then differs from the sum of the token-by-token ones: the mask sees the
future.

The causal scope masks at row ``i`` what the non-causal scope would mask if the text
ended at query ``i``:

    n_i = eligible entries in rows <= i of the unit,  k_i = round_half_up(r * n_i)
    comprehensiveness   row i's entries among the k_i top-ranked of rows <= i
    sufficiency         row i's entries among the k_i bottom-ranked of rows <= i

The order between two entries is the unit's own (score, then the ranking's tie order),
which depends on those two entries only, so the prefix ranks
(:func:`cwlens.core.prefix_rank.prefix_ranks`) of rows ``<= i`` are those a ranking of
the prefix alone would give. At row scope the prefix of a row is the row: nothing
changes. The total masked per unit is no longer exactly ``round(r * n)`` (each query
counts its own prefix), but every prefix of the text is masked at rate ``r`` in its last
row, and a text scored token by token is masked exactly as scored whole.

:func:`require_causal` refuses the non-causal head/layer scopes where they would leak
(a next-token loss or log-likelihood on a decoder).
"""

import torch

from cwlens.core.prefix_rank import prefix_ranks
from cwlens.errors import InvalidArgumentError
from cwlens.faithfulness.ranking import Ranking


class LeakingScopeError(InvalidArgumentError):
    """A head/layer scope whose masks would depend on the tokens being scored."""


def causal_ranking(ranking: Ranking) -> Ranking:
    """The causal version of a head/layer-scope ``ranking`` (a row-scope one is returned
    as it is). ``rank`` becomes each entry's rank among the eligible entries of rows
    ``<= i`` of its unit, ``n_eligible`` their number ``n_i`` (``[b, h, q, 1]`` for head
    scope, ``[b, 1, q, 1]`` for layer scope), so :meth:`Ranking.mask` applies unchanged."""
    if ranking.scope == "row":
        return ranking
    rank, n = ranking.rank, ranking.n_eligible
    b, h, q, k = rank.shape
    eligible = rank < n  # ineligible entries rank after every eligible one of the unit
    if ranking.scope == "head":
        pr = prefix_ranks(rank.reshape(b * h, q, k)).reshape(b, h, q, k)
        n_i = eligible.sum(-1).cumsum(-1)[..., None]
    else:
        keys = rank.permute(0, 2, 1, 3).reshape(b, q, h * k)
        pr = prefix_ranks(keys).reshape(b, q, h, k).permute(0, 2, 1, 3)
        n_i = eligible.sum((1, 3)).cumsum(-1)[:, None, :, None]
    return Ranking(pr.to(torch.int32).contiguous(), n_i.to(torch.int64), ranking.scope)


def require_causal(scope: str, causal_only: bool, what: str) -> None:
    """Raise :class:`LeakingScopeError` for a non-causal head/layer scope on a next-token
    measure (``what``): its masks at query ``i`` would read the later tokens."""
    if scope != "row" and not causal_only:
        raise LeakingScopeError(
            f"scope={scope!r} with causal_only=False for {what}: the mask at query i would "
            "be decided from later rows, so it depends on the very tokens being scored. "
            "Use causal_only=True (the default: head/layer masks are then decided from "
            "rows <= i, cwlens.faithfulness.causal_scope) or scope='row' (CLI: leave out "
            "--non-causal, or --scope row)."
        )
