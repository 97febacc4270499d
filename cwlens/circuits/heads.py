"""Head scores at chosen query positions from a cache: contribution and attention.

For query ``i`` and head ``h`` of layer ``l`` (inter-head weights ``c_ij^h``, which sum to 1
over heads and keys, see :mod:`cwlens.core.geometry`):

    contribution_share  sum_j c_ij^h = <o_i, o_i^h> / ||o_i||^2
                        the head's signed share of the layer's attention output at i
    contribution_key    c_ik^h for the task's key k (e.g. the induction key, the IO name)
    attention_key       a_ik^h, the classic attention score on that key

Each is averaged over the batch and the chosen queries. ``keys`` is ``[batch, n_queries]``
(one key position per query). Scores are per layer, so contribution shares of different
layers are shares of different outputs; :mod:`cwlens.circuits.direct` puts every head on
the common scale of the logit difference.
"""

from collections.abc import Sequence

import torch

from cwlens.circuits import checks
from cwlens.circuits.results import HeadScores
from cwlens.engine import adapter, hook_names
from cwlens.engine.entry import ModelLike, takes_model


def _at_queries(weights: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """``[batch, head, query, key]`` -> ``[batch, n_queries, head, key]``."""
    return weights[:, :, queries, :].permute(0, 2, 1, 3)


def _on_keys(weights_q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Pick one key per (batch, query): ``[batch, n_queries, head]``."""
    b, n, h, _ = weights_q.shape
    index = keys.to(weights_q.device)[:, :, None, None].expand(b, n, h, 1)
    return weights_q.gather(-1, index)[..., 0]


@takes_model
def head_scores(
    cache,
    model: ModelLike,
    queries: Sequence[int],
    keys: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
) -> dict[str, HeadScores]:
    """``{"contribution_share", "contribution_key", "attention_key"}`` (the last two only
    when ``keys`` is given) as :class:`HeadScores` ``[layer, head]``.

    On a padded batch (a list of texts, whose cache remembers its mask, or
    ``attention_mask``) a query or key position that is padding in some row is refused
    (``InvalidArgumentError``): its scores are no token's and would be averaged in. Count
    from the end on a left-padded decoder (-1 is every text's last token)."""
    b, _, n, _ = adapter.read(cache, hook_names.pattern(0), model).shape
    q = checks.positions(queries, n)
    if keys is not None:
        checks.key_positions(keys, q, b, n, causal=not model.is_encoder)
    checks.real_queries(adapter.cache_mask(cache) if attention_mask is None else attention_mask, q, keys)
    share, con_key, att_key = [], [], []
    for layer in range(model.n_layers):
        geo = adapter.geometry(cache, model, layer, attention_mask)
        con = _at_queries(geo.contribution("inter"), q.to(geo.pattern.device))
        share.append(con.sum(-1).mean((0, 1)))
        if keys is not None:
            att = _at_queries(geo.attention(), q.to(geo.pattern.device))
            con_key.append(_on_keys(con, keys).mean((0, 1)))
            att_key.append(_on_keys(att, keys).mean((0, 1)))

    def pack(rows):
        return torch.stack(rows).double().cpu()

    out = {"contribution_share": HeadScores(
        "contribution_share", pack(share), "the head's signed share of its layer's attention output")}
    if keys is not None:
        out["contribution_key"] = HeadScores(
            "contribution_key", pack(con_key), "contribution weight of the task's key")
        out["attention_key"] = HeadScores(
            "attention_key", pack(att_key), "attention weight on the task's key")
    return out
