"""The contribution graph's edges from one block of query rows (pure torch).

A node ``(l, i)`` is position ``i``'s residual stream after block ``l`` (``l = 0``: the
token embeddings). Block ``l``'s attention adds ``a_i`` to the stream ``r_i`` entering it;
with ``r'_i = r_i + a_i`` the residual keeps the share ``s_res = <r'_i, r_i> / ||r'_i||^2``
and attention brings ``s_att = <r'_i, a_i> / ||r'_i||^2`` (``s_res + s_att = 1``; token
flow's ``rule="signed"``, :mod:`cwlens.circuits.flow_math`). A metric's per-head weights
``w_ij^h`` of the layer split the attention share over keys and heads:

    W_ij = sum_h w_ij^h / Z_i          (Z_i = 1 for the inter-head contribution, which
                                        sums to 1 over heads and keys; else the row's
                                        total over heads and keys, so that rows sum to 1)
    F_ij = s_att_i W_ij + [i == j] s_res_i

``F_ij`` is the weight of the edge ``(l-1, j) -> (l, i)``; the self edge ``(l-1, i) ->
(l, i)`` also carries the residual's own share. The MLP is token-local (it adds to
``r'_i`` what is a function of ``r'_i`` alone), so it moves nothing between positions.
"""

import torch

#: metrics whose inter-head rows already sum to 1 (no renormalisation: the signed
#: contribution's row total is 1 up to rounding, and dividing by it would only add noise)
UNIT_ROWS = ("contribution",)


def residual_shares(resid: torch.Tensor, attn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s_res, s_att)`` ``[..., pos]`` from ``resid``, ``attn`` ``[..., pos, d_model]``:
    the projections of ``r`` and ``a`` on ``r' = r + a`` over ``||r'||^2`` (0 where ``r' = 0``)."""
    new = resid + attn
    norm = (new * new).sum(-1)
    ok = norm > 0
    safe = torch.where(ok, norm, torch.ones_like(norm))
    zero = torch.zeros_like(norm)
    return (torch.where(ok, (new * resid).sum(-1) / safe, zero),
            torch.where(ok, (new * attn).sum(-1) / safe, zero))


def row_scale(weights: torch.Tensor, metric: str) -> torch.Tensor:
    """``1 / Z_i`` ``[query]`` for one layer's ``[head, query, key]`` weights of ``metric``
    (1 for the contribution; 0 for a row whose total is 0)."""
    if metric in UNIT_ROWS:
        return torch.ones(weights.shape[1], dtype=weights.dtype, device=weights.device)
    total = weights.sum((0, 2))
    ok = total != 0
    return torch.where(ok, 1.0 / torch.where(ok, total, torch.ones_like(total)), torch.zeros_like(total))


def block_edges(weights: torch.Tensor, metric: str, s_res: torch.Tensor, s_att: torch.Tensor,
                query_start: int, k: int, allowed: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The incoming edges of one block of ``q`` query nodes from their ``[head, q, width]``
    weights (keys ``0 .. width-1``; queries ``query_start ..``).

    Slot 0 of each node is its self edge (the residual share plus the attention the
    position gives itself); slots ``1 .. k`` the ``k`` other keys of largest ``|F_ij|``,
    strongest first. ``allowed`` ``[q, width]`` (None: all) marks the keys a query may
    attend to; a node with fewer than ``k`` others ends in slots marked -1 / NaN.

    Returns ``from_position`` ``[q, k + 1]`` (int64, -1: none), ``weight`` ``[q, k + 1]``,
    ``heads`` ``[q, k + 1, head]`` (each head's part of the attention term; they sum to
    ``weight - residual``), ``residual`` ``[q]`` (``s_res``), ``attention`` ``[q]``
    (``s_att``) and ``head_share`` ``[q, head]`` (``sum_j w_ij^h / Z_i``: each head's
    share of the layer's attention output).
    """
    h, q, width = weights.shape
    scale = row_scale(weights, metric)  # [q]
    token = weights.sum(0) * scale[:, None]  # W: [q, width]
    rows = torch.arange(q, device=weights.device)
    self_pos = rows + query_start
    score = token.abs()
    invalid = torch.zeros_like(score, dtype=torch.bool)
    if allowed is not None:
        invalid |= ~allowed
    inside = self_pos < width
    invalid[rows[inside], self_pos[inside]] = True  # the self edge has its own slot
    score = score.masked_fill(invalid, -1.0)
    kk = min(k, width)
    top, idx = score.topk(kk, dim=-1) if kk > 0 else (score[:, :0], score[:, :0].long())
    ok = top >= 0
    from_pos = torch.cat([self_pos[:, None], torch.where(ok, idx, -1)], 1)
    if kk < k:
        from_pos = torch.cat([from_pos, from_pos.new_full((q, k - kk), -1)], 1)
    gather = from_pos.clamp(0, max(width - 1, 0))
    per_head = weights.gather(2, gather[None].expand(h, -1, -1)) * scale[None, :, None]  # [h, q, K]
    per_head = per_head * s_att[None, :, None]
    per_head = per_head.permute(1, 2, 0)  # [q, K, h]
    valid = from_pos >= 0
    per_head = torch.where(valid[..., None], per_head, torch.full_like(per_head, float("nan")))
    weight = per_head.sum(-1)
    weight[:, 0] = weight[:, 0] + s_res
    share = weights.sum(2).T * scale[:, None]  # [q, h]
    return {"from_position": from_pos, "weight": weight, "heads": per_head, "residual": s_res,
            "attention": s_att, "head_share": share}


def largest_heads(heads: torch.Tensor, m: int) -> torch.Tensor:
    """The ``m`` heads of largest ``|part|`` of each edge: ``[..., m]`` indices into the
    last axis of ``heads`` ``[..., head]`` (NaN rows: any order)."""
    return heads.nan_to_num(0.0).abs().topk(min(m, heads.shape[-1]), dim=-1).indices


def factor_split(attention: torch.Tensor, contribution: torch.Tensor, value_norm: torch.Tensor,
                 output_norm: torch.Tensor) -> torch.Tensor:
    """``[..., 3]``: ``(attention, relative_norm, cosine)`` of entries whose contribution
    weight is ``contribution = attention * relative_norm * cosine`` with
    ``relative_norm = ||v~_j^h|| / ||o_i||`` (inter-head ``o``); all inputs broadcast to
    one shape. The cosine is 0 where ``attention * relative_norm`` is."""
    inv = torch.where(output_norm > 0, 1.0 / torch.where(output_norm > 0, output_norm, 1.0), 0.0)
    rel = value_norm * inv
    den = attention * rel
    ok = den != 0
    cos = torch.where(ok, contribution / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(den))
    return torch.stack(torch.broadcast_tensors(attention, rel, cos), -1)
