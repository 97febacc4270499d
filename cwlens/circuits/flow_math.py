"""Token flow: contribution weights composed through the residual stream (pure torch).

Definition. Let ``r_i`` be position ``i``'s residual stream entering layer ``l``
(``hook_resid_pre``), ``a_i`` what the attention block adds (``hook_resid_mid - hook_resid_pre``,
so ``b_O`` included) and ``r'_i = r_i + a_i``. Three rules split ``r'_i`` into what it keeps
from ``r_i`` and what attention brought from each key:

    rule="signed"            s^res_i = <r'_i, r_i> / ||r'_i||^2,  s^att_i = <r'_i, a_i> / ||r'_i||^2
                             (the projection shares; s^res + s^att = 1 exactly, either may
                             be negative), and the attention share is spread over keys by
                             the token-level inter-head contribution weights
                             C_ij = sum_h c_ij^h (rows sum to 1; signed).
    rule="absolute"          s^res, s^att proportional to |<r'_i, r_i>|, |<r'_i, a_i>| and
                             C replaced by |C_ij| / sum_k |C_ik|: every factor is >= 0, so
                             flows are proportions (rows are probability vectors).
    rule="projection"        (token_flow's default) every part projected on r'_i itself:
                             key j's term
                             z_ij = sum_h a_ij^h v~_j^h gets <r'_i, z_ij> / ||r'_i||^2, the
                             residual s^res as above, and b_O's projection
                             <r'_i, b_O> / ||r'_i||^2 (what is left of s^att) is spread by C.
                             "signed" instead splits the share projected on r'_i by weights
                             projected on the attention output o_i -- two different
                             directions; here every number is a share of the same vector.

One layer's flow matrix is ``F_l = diag(s^res) + diag(s^att) C`` (``[pos, pos]``, lower
triangular in a causal model): position ``i`` after attention is ``F_l[i, j]`` made of
position ``j`` before it. The MLP is token-local: ``mlp(r'_i)`` is a function of ``r'_i``
alone, so it inherits ``r'_i``'s composition (its flow matrix is the identity). ``b_O``
belongs to no token: its part of ``a_i`` is spread with the same weights ``C_i`` (under
"projection" only b_O's own projection is; the keys' terms are projected directly).

Composing, ``flows[0] = I`` and ``flows[l+1] = F_l flows[l]``: ``flows[l][i, j]`` is how
much of position ``i``'s residual stream entering layer ``l`` (``flows[n_layers]``: the
final stream) comes from input token ``j``. Rows sum to 1 under every rule.

Graph. For a target position ``t`` at the top, the importance of node ``(l, j)`` is
``N_l = e_t F_{L-1} ... F_l`` (``N_L = e_t``; ``N_0 = flows[L][t]``), and the edge from
``(l, j)`` to ``(l+1, i)`` has weight ``N_{l+1}[i] F_l[i, j]``. Each layer's edges sum to
``sum_i N_{l+1}[i] = 1``.
"""

import torch

from cwlens.errors import UnknownOptionError

RULES = ("signed", "absolute", "projection")


def check_rule(rule: str) -> str:
    if rule not in RULES:
        raise UnknownOptionError(
            f"Unknown rule={rule!r}. Valid rules: 'signed' (projection shares, signed "
            "contribution weights), 'absolute' (absolute values renormalised to proportions) "
            "or 'projection' (each key's term projected on r' itself)."
        )
    return rule


def _safe(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))


def residual_shares(resid: torch.Tensor, attn: torch.Tensor, rule: str = "signed"):
    """``(s_res, s_att)``, each ``[..., pos]``, from ``resid``/``attn`` ``[..., pos, d_model]``."""
    new = resid + attn
    dot_r, dot_a = (new * resid).sum(-1), (new * attn).sum(-1)
    if check_rule(rule) in ("signed", "projection"):
        norm = (new * new).sum(-1)
        return _safe(dot_r, norm), _safe(dot_a, norm)
    total = dot_r.abs() + dot_a.abs()
    return _safe(dot_r.abs(), total), _safe(dot_a.abs(), total)


def mixing_matrix(token_weights: torch.Tensor, rule: str = "signed") -> torch.Tensor:
    """``C`` (signed) or ``|C| / rowsum |C|`` (absolute), ``[..., query_pos, key_pos]``."""
    if check_rule(rule) in ("signed", "projection"):
        return token_weights
    a = token_weights.abs()
    return _safe(a, a.sum(-1, keepdim=True))


def layer_flow(resid, attn, token_weights, rule: str = "signed", key_dots=None) -> torch.Tensor:
    """``F_l = diag(s_res) + diag(s_att) C``: ``[..., pos, pos]``. ``rule="projection"``
    needs ``key_dots[..., i, j] = <r'_i, z_ij>`` (:func:`key_projections`) and gives
    ``diag(s_res) + key_dots / ||r'||^2 + diag(s_bO) C`` with
    ``s_bO = s_att - sum_j key_dots_ij / ||r'_i||^2`` (b_O's projection)."""
    s_res, s_att = residual_shares(resid, attn, rule)
    mix = mixing_matrix(token_weights, rule)
    if rule != "projection":
        return torch.diag_embed(s_res) + s_att[..., None] * mix
    if key_dots is None:
        raise UnknownOptionError("rule='projection' needs key_dots (<r'_i, z_ij>, see key_projections).")
    new = resid + attn
    share = _safe(key_dots, (new * new).sum(-1)[..., None])
    rest = s_att - share.sum(-1)
    return torch.diag_embed(s_res) + share + rest[..., None] * mix


def key_projections(new, pattern, v, W_O) -> torch.Tensor:
    """``<r'_i, z_ij>`` with ``z_ij = sum_h a_ij^h v_j^h W_O^h``: ``[query_pos, key_pos]`` for
    one sequence. ``new``: ``r'`` ``[query_pos, d_model]``; ``pattern`` ``[head, query, key]``;
    ``v`` ``[key_pos, kv_head, d_head]`` (grouped-query heads share a kv head);
    ``W_O`` ``[head, d_head, d_model]``."""
    group = W_O.shape[0] // v.shape[1]
    vh = v.repeat_interleave(group, dim=1)  # [key, head, d_head]
    read = torch.einsum("qm,hdm->qhd", new, W_O)  # r'_i W_O^h^T
    return torch.einsum("hqk,qhd,khd->qk", pattern, read, vh)


def compose(layer_flows: torch.Tensor) -> torch.Tensor:
    """``[layer, ..., pos, pos]`` -> ``[layer + 1, ..., pos, pos]`` with ``flows[0] = I``."""
    n = layer_flows.shape[-1]
    eye = torch.eye(n, dtype=layer_flows.dtype, device=layer_flows.device)
    out = [eye.expand_as(layer_flows[0])]
    for f in layer_flows:
        out.append(f @ out[-1])
    return torch.stack(out)


def node_importance(layer_flows: torch.Tensor, target: int) -> torch.Tensor:
    """``N``: ``[layer + 1, pos]`` for one sequence (``layer_flows``: ``[layer, pos, pos]``)."""
    n_layers, n = layer_flows.shape[0], layer_flows.shape[-1]
    nodes = [torch.zeros(n, dtype=layer_flows.dtype, device=layer_flows.device)]
    nodes[0][target] = 1.0
    for layer in range(n_layers - 1, -1, -1):
        nodes.append(nodes[-1] @ layer_flows[layer])
    return torch.stack(nodes[::-1])


def edge_weights(layer_flows: torch.Tensor, target: int) -> torch.Tensor:
    """``E[l, i, j] = N_{l+1}[i] F_l[i, j]``: ``[layer, to_pos, from_pos]``."""
    nodes = node_importance(layer_flows, target)
    return nodes[1:, :, None] * layer_flows


def support(n: int, n_layers: int, causal: bool, windows=None) -> torch.Tensor:
    """``[layer, to_pos, from_pos]`` bool: where ``F_l`` may be non-zero at all, the
    position itself (the residual share) and the keys its query attends to (on a decoder
    none after it; within a sliding-window layer's window ``windows[l]``)."""
    pos = torch.arange(n)
    out = []
    for layer in range(n_layers):
        keys = torch.ones(n, n, dtype=torch.bool)
        if causal:
            keys = pos[None, :] <= pos[:, None]
            window = None if windows is None else windows[layer]
            if window is not None:
                keys = keys & (pos[None, :] > pos[:, None] - window)
        out.append(keys | torch.eye(n, dtype=torch.bool))
    return torch.stack(out)


def reachable(layer_support: torch.Tensor, target: int) -> torch.Tensor:
    """``[layer + 1, pos]`` bool: the nodes from which the target can be reached through
    ``layer_support`` (where :func:`node_importance` may be non-zero)."""
    n_layers, n = layer_support.shape[0], layer_support.shape[-1]
    nodes = [torch.zeros(n, dtype=torch.bool)]
    nodes[0][target] = True
    for layer in range(n_layers - 1, -1, -1):
        nodes.append((nodes[-1][:, None] & layer_support[layer]).any(0))
    return torch.stack(nodes[::-1])
