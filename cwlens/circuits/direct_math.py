"""Direct logit attribution of each head's ``a_ij v~_j`` terms (pure torch, no model).

The final residual at query ``i`` is a sum of components (embedding, every head's terms
``a_ij^h v~_j^h``, every ``b_O``, every MLP output). The logit difference read there is

    D_i = < LN(x_i), u > + beta,     u = W_U[:, answer] - W_U[:, foil]

(``foil=None``: ``u = W_U[:, answer] - mean_v W_U[:, v]``, the answer's logit minus the mean
logit). With the final norm's scale ``s_i`` *frozen* at its value in the run, as
TransformerLens' direct logit attribution does (``apply_ln_to_stack``), the norm is linear:

    LN(x) = w * (P x) / s_i + b,    P = centring (LayerNorm) or identity (RMSNorm)

so ``D_i = sum_c < c, u' > / s_i + < b, u > + beta`` with ``u' = P (w * u)`` (P is
symmetric, so the centring moves onto the direction). Each head and key gets

    DLA_ij^h = a_ij^h < v~_j^h, u' > / s_i = a_ij^h < v_j, W_O^h u' > / s_i

computed through ``d_head`` without building ``v~``. Summed over heads and keys, plus the
other components, it equals ``D_i`` exactly (up to float rounding) for the frozen ``s_i``.
"""

import torch


def head_key_terms(
    pattern: torch.Tensor,
    v: torch.Tensor,
    W_O: torch.Tensor,
    directions: torch.Tensor,
    scale: torch.Tensor,
    queries: torch.Tensor,
) -> torch.Tensor:
    """``DLA_ij^h`` for one layer: ``[batch, n_queries, head_index, key_pos]``.

    Args:
        pattern: ``[batch, head_index, query_pos, key_pos]``.
        v: ``[batch, key_pos, kv_head, d_head]`` (GQA: query head h reads kv head h // (H/G)).
        W_O: ``[head_index, d_head, d_model]``.
        directions: ``[batch, n_queries, d_model]``, the ``u'`` of each chosen query.
        scale: ``[batch, n_queries]``, the frozen final-norm scale ``s_i``.
        queries: ``[n_queries]`` long, the chosen query positions.
    """
    dtype = torch.float64 if torch.float64 in (pattern.dtype, v.dtype, W_O.dtype) else torch.float32
    n_heads, n_kv = pattern.shape[1], v.shape[2]
    v_heads = v.to(dtype).repeat_interleave(n_heads // n_kv, dim=2)  # [b, k, h, d]
    read = torch.einsum("hdm,bnm->bnhd", W_O.to(dtype), directions.to(dtype))  # W_O^h u'
    dots = torch.einsum("bnhd,bkhd->bnhk", read, v_heads)  # <v~_j^h, u'>
    alpha = pattern.to(dtype)[:, :, queries, :].permute(0, 2, 1, 3)  # [b, n, h, k]
    return alpha * dots / scale.to(dtype)[:, :, None, None]


def component_terms(
    component: torch.Tensor, directions: torch.Tensor, scale: torch.Tensor, queries: torch.Tensor
) -> torch.Tensor:
    """``<c_i, u'> / s_i`` of a residual component ``[batch, pos, d_model]`` (or a
    ``[d_model]`` constant such as ``b_O``): ``[batch, n_queries]``."""
    dtype = directions.dtype
    if component.ndim == 1:
        at_q = component.to(dtype)[None, None, :]
    else:
        at_q = component.to(dtype)[:, queries, :]
    return (at_q * directions).sum(-1) / scale.to(dtype)


def effective_directions(
    W_U: torch.Tensor,
    answers: torch.Tensor,
    foils: torch.Tensor | None,
    ln_weight: torch.Tensor | None,
    center: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(u, u')``: the unembedding direction and the one read through the norm weight and
    the centring, each ``[batch, n_queries, d_model]``.

    ``W_U``: ``[d_model, d_vocab]``; ``answers``/``foils``: ``[batch, n_queries]`` token ids.
    """
    W_U = W_U.to(torch.float64)
    u = W_U.T[answers]  # [b, n, m]
    u = u - (W_U.mean(1) if foils is None else W_U.T[foils])
    u_eff = u if ln_weight is None else u * ln_weight.to(torch.float64)
    if center:
        u_eff = u_eff - u_eff.mean(-1, keepdim=True)
    return u, u_eff


def logit_difference(
    logits: torch.Tensor, queries: torch.Tensor, answers: torch.Tensor, foils: torch.Tensor | None
) -> torch.Tensor:
    """``logit[answer] - logit[foil]`` (or minus the mean logit) at each query: ``[batch, n_queries]``."""
    at_q = logits[:, queries, :].double()
    ans = at_q.gather(-1, answers[..., None])[..., 0]
    other = at_q.mean(-1) if foils is None else at_q.gather(-1, foils[..., None])[..., 0]
    return ans - other
