"""ALTI (Ferrando et al. 2022) and its attention-only variant, as L1 proximities.

Both score every entry ``(head h, query i, key j)`` by how close its term ``z_ij^h =
a_ij^h v~_j^h`` (``v~_j^h = v_j^g W_O^h``, :mod:`cwlens.core.geometry`) is to a whole
``y_i`` it is part of, in L1, normalised over the parts of that whole::

    p(part) = max(0, ||y_i||_1 - ||y_i - part||_1)       proximity of the part to the whole
    share(part) = p(part) / sum_parts p                  normalised to sum 1

``alti`` -- ALTI as defined by Ferrando et al. (2022, "Measuring the Mixing of Contextual
Information in the Transformer") with the parts of llm-transparency-tool (Ferrando &
Voita 2024, ``routes/contributions.py``: one part per (key, head) and the residual stream
as one more part). The whole is the residual stream after the attention block:

* pre-LN decoders: ``y_i = resid_mid_i = x_i + sum_{h,j} z_ij^h + b_O`` with ``x_i =
  resid_pre_i``; the parts are the ``z_ij^h`` and ``x_i``. Nothing is linearised (the
  block's own norm acts on each ``x_j`` before the values, so every part is still a
  function of one token).
* post-LN encoders (BERT): ``y_i = LN(x_i + sum z_ij^h + b_O)``. As in the paper, the
  LayerNorm is linearised at the whole: its mean is linear anyway, and its scale
  ``sigma_i = sqrt(var(x_i + sum z + b_O) + eps)`` is held at the whole's value, so
  ``LN(u) = sum_parts L_i(part) + L_i(b_O) + beta`` exactly, with ``L_i(u) = gamma *
  (u - mean(u)) / sigma_i``. The parts are ``L_i(z_ij^h)`` and ``L_i(x_i)``. What is an
  approximation is the choice to share ``sigma_i`` among the parts (each part is scored
  as if the others set the scale).
* decoders with a norm between the heads and the residual sum (Gemma-2/3's
  ``post_attention_layernorm``, an RMSNorm): ``y_i = resid_mid_i = x_i + N(sum z + b_O)``
  with ``N(u) = gamma * u / sqrt(mean(u^2) + eps)`` (``gamma`` = Hugging Face's ``1 +
  weight``). The norm is linearised the same way: its scale ``rms_i = sqrt(mean(attn_i^2)
  + eps)`` of the attention output ``attn_i = sum z + b_O`` is held at the whole's value,
  so ``N(attn_i) = sum gamma * z_ij^h / rms_i + gamma * b_O / rms_i`` exactly. The parts
  are ``gamma * z_ij^h / rms_i`` and ``x_i`` (the residual does not pass the norm).

``b_O`` (and ``beta``) are in the whole but in no part, as in the tool. The residual part
is in the normaliser (the shares of the heads and keys of a query sum to ``1 - residual
share``); only the (head, key) shares are returned for ranking. ``kind`` does not apply
(the whole is one vector per query).

``alti_attention`` -- the earlier cwlens variant, kept under an honest name: the whole is
the attention output only (no residual part, no norm). ``kind="intra"``: ``y = o_i^h``,
normalised over the keys of one head; ``kind="inter"``: ``y = o_i`` (no b_O), normalised
over every head and key of query ``i``.

Both clip at 0 as the paper does (the tool clips at ``1e-5``): entries with ``a = 0``
score exactly 0, and so do parts farther from the whole than the zero vector. Such ties
are broken at random by the faithfulness rankings (:mod:`cwlens.faithfulness.ranking`).
Where every ``p`` of a query is 0 its shares are 0.

Cost: ``||y - z_ij||_1`` is not a function of inner products, so it needs the
``d_model``-sized difference of every (head, query, key): ``O(batch * heads * n^2 *
d_model)`` per layer, ``d_model / d_head`` times a contribution weight's. Memory stays
bounded: the differences are built for a block of queries at a time (at most
``max_elements`` numbers), and keys after the last nonzero attention entry of the block
(a causal mask) are skipped, which is exact (``a = 0`` gives ``p = 0``).
"""

from dataclasses import dataclass

import torch

from cwlens.core.numerics import check_kind, safe_divide

DEFAULT_MAX_ELEMENTS = 1 << 24  # 64 MB of float32 per block of differences


@dataclass(frozen=True)
class PostNorm:
    """A LayerNorm applied to the residual stream after attention (post-LN encoders):
    ``LN(u) = gamma * (u - mean(u)) / sqrt(var(u) + eps) + beta`` over ``d_model``."""

    weight: torch.Tensor  # gamma [d_model]
    bias: torch.Tensor  # beta [d_model]
    eps: float


@dataclass(frozen=True)
class AttentionOutputNorm:
    """An RMSNorm applied to the attention output before the residual sum (Gemma-2/3's
    ``post_attention_layernorm``): ``N(u) = gamma * u / sqrt(mean(u^2) + eps)`` over
    ``d_model``, with ``gamma`` the effective scale (Hugging Face's ``1 + weight``)."""

    weight: torch.Tensor  # gamma [d_model]
    eps: float


def _proximities(a, v_tilde, whole, scale, max_elements) -> torch.Tensor:
    """``max(0, ||y||_1 - ||y - scale * a_ij v~_j||_1)`` ``[b, h, q, k]``.

    ``a`` ``[b, h, q, k]``; ``v_tilde`` ``[b, h, k, m]``; ``whole`` ``[b, h or 1, q, m]``;
    ``scale`` None or ``[b, 1, q]`` (a per-query factor of every part).
    """
    b, h, q, k = a.shape
    d_model = v_tilde.shape[-1]
    out = torch.zeros_like(a)
    step = max(1, max_elements // max(1, b * h * k * d_model))
    for start in range(0, q, step):
        stop = min(q, start + step)
        block = a[:, :, start:stop]
        used = block.ne(0).flatten(0, 2).any(0).nonzero()
        if not len(used):
            continue
        width = int(used.max()) + 1  # keys after it have a = 0 in every row: p = 0
        if scale is not None:
            block = block * scale[:, :, start:stop, None]
        y = whole[:, :, start:stop, None, :]  # [b, h or 1, c, 1, m]
        diff = block[..., :width, None] * v_tilde[:, :, None, :width]  # z: [b, h, c, width, m]
        dist = diff.sub_(y).abs_().sum(-1)  # ||z - y||_1
        del diff
        out[:, :, start:stop, :width] = (y.abs().sum(-1) - dist).clamp_min_(0)
    return out


def _projected_values(geometry) -> torch.Tensor:
    v_heads = geometry.v.repeat_interleave(geometry.group, dim=2)  # [b, k, h, d]
    return torch.einsum("bkhd,hdm->bhkm", v_heads, geometry.W_O)  # [b, h, k, m]


def alti_attention_weights(geometry, kind: str = "inter",
                           max_elements: int = DEFAULT_MAX_ELEMENTS) -> torch.Tensor:
    """``alti_attention`` shares ``[batch, head_index, query_pos, key_pos]`` of one layer's
    :class:`~cwlens.core.AttentionGeometry` (the whole = the attention output; see the
    module docstring)."""
    check_kind(kind)
    if kind == "inter":
        whole = geometry.layer_output[:, None]  # [b, 1, q, m]
    else:
        whole = geometry.head_outputs().permute(0, 2, 1, 3)  # [b, h, q, m]
    out = _proximities(geometry.pattern, _projected_values(geometry), whole, None, max_elements)
    total = out.sum(-1, keepdim=True) if kind == "intra" else out.sum((1, 3), keepdim=True)
    return safe_divide(out, total)


def alti_parts(geometry, max_elements: int = DEFAULT_MAX_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor]:
    """``(entries [batch, head_index, query_pos, key_pos], residual [batch, query_pos])``:
    ALTI shares of every (head, key) term and of the residual stream (they sum to 1 per
    query, or are all 0). Needs the geometry's residual stream (``geometry.residual``)."""
    residual, b_O, norm = geometry.require_residual("alti")
    a = geometry.pattern
    v_tilde = _projected_values(geometry)
    x = residual.to(a.dtype)
    attn = geometry.layer_output + b_O.to(a.dtype)  # the attention output [b, q, m]
    mid = x + attn  # resid_mid, where no norm follows attention
    scale = None
    if isinstance(norm, AttentionOutputNorm):  # resid_mid = x + gamma * attn / rms
        gamma = norm.weight.to(a.dtype)
        rms = (attn.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()  # [b, q, 1]
        whole = x + gamma * attn / rms
        v_tilde = gamma * v_tilde
        scale = rms[:, None, :, 0].reciprocal()  # [b, 1, q]
    elif norm is not None:  # linearised at the whole: L(u) = gamma (u - mean u) / sigma
        gamma = norm.weight.to(a.dtype)
        sigma = (mid.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()  # [b, q, 1]
        whole = gamma * (mid - mid.mean(-1, keepdim=True)) / sigma + norm.bias.to(a.dtype)
        v_tilde = gamma * (v_tilde - v_tilde.mean(-1, keepdim=True))
        scale = sigma[:, None, :, 0].reciprocal()  # [b, 1, q]
        x = gamma * (x - x.mean(-1, keepdim=True)) / sigma
    else:
        whole = mid
    entries = _proximities(a, v_tilde, whole[:, None], scale, max_elements)
    y_l1 = whole.abs().sum(-1)
    resid = (y_l1 - (whole - x).abs().sum(-1)).clamp_min_(0)  # [b, q]
    total = entries.sum((1, 3)) + resid  # [b, q]
    return safe_divide(entries, total[:, None, :, None]), safe_divide(resid, total)


def alti_weights(geometry, max_elements: int = DEFAULT_MAX_ELEMENTS) -> torch.Tensor:
    """ALTI shares ``[batch, head_index, query_pos, key_pos]`` of the (head, key) terms
    (see :func:`alti_parts`; the residual's share is left out, not renormalised away)."""
    return alti_parts(geometry, max_elements)[0]
