"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers"):
attention composed through the layers, the residual connection counted as half of
every layer (pure torch).

Per layer ``l`` the heads' patterns are averaged, ``A_l = mean_h A_l^h``, and the residual
connection is added as an identity of equal weight::

    A~_l = 0.5 A_l + 0.5 I        (rows still sum to 1 where A_l's do)

and the rollout multiplies them from the first layer up::

    R_0 = I,    R_{l+1} = A~_l R_l

``R_L[i, j]`` is how much of the final stream at position ``i`` the rollout credits to input
token ``j``: attention's counterpart of :mod:`cwlens.circuits.flow_math`'s token flow
(which composes contribution weights with the residual's measured share instead of a
fixed half). Each mixed row is renormalised to sum 1 (a row of zeros, e.g. a padded
query, becomes the identity's row).
"""

import torch

from cwlens.errors import InvalidArgumentError, ShapeMismatchError


def rollout(patterns: torch.Tensor, residual_weight: float = 0.5) -> torch.Tensor:
    """``R_L``, ``[..., query_pos, key_pos]`` float64, from ``patterns`` ``[layer, ...,
    head_index, query_pos, key_pos]`` (e.g. ``[layer, batch, head, q, k]``; a single head
    or heads already averaged: ``[layer, ..., 1, q, k]``). ``residual_weight`` is the
    identity's share (0.5 in the paper)."""
    if patterns.ndim < 4 or patterns.shape[-1] != patterns.shape[-2]:
        raise ShapeMismatchError(
            f"patterns must be [layer, ..., head, query, key] with query == key; got "
            f"{list(patterns.shape)}. Stack each layer's hook_pattern first (torch.stack).")
    if not 0 <= residual_weight <= 1:
        raise InvalidArgumentError(
            f"residual_weight must lie in [0, 1] (0.5 in the paper); got {residual_weight!r}.")
    mean = patterns.to(torch.float64).mean(-3)  # [layer, ..., q, k]
    n = mean.shape[-1]
    eye = torch.eye(n, dtype=torch.float64, device=mean.device)
    mixed = (1 - residual_weight) * mean + residual_weight * eye
    total = mixed.sum(-1, keepdim=True)
    mixed = torch.where(total > 0, mixed / torch.where(total > 0, total, 1.0), mixed)
    out = eye.expand_as(mixed[0]).clone()
    for layer in mixed:
        out = layer @ out
    return out
