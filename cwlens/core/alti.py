"""ALTI-style L1-proximity contributions (Ferrando et al. 2022; llm-transparency-tool).

The peers' per-entry metric, for comparison with the contribution weights. For query
``i`` of head ``h`` (kv group ``g``) and key ``j``, with ``z_ij^h = a_ij^h v~_j^h`` the
entry's term (``v~_j^h = v_j^g W_O^h``, see :mod:`cwlens.core.geometry`) and ``o`` the
output it is part of::

    p_ij^h = max(0, ||o||_1 - ||o - z_ij^h||_1)          proximity of the part to the whole
    alti_ij^h = p_ij^h / sum p                            normalised to sum 1

``kind="intra"``: ``o = o_i^h`` (the head's output) and the sum runs over the keys ``j``
of that head's row. ``kind="inter"``: ``o = o_i`` (the layer's multi-head output, no
b_O) and the sum runs over every head and key of query ``i``, as llm-transparency-tool's
``get_contributions`` normalises the parts ``(key, head)`` of one position. Where every
``p`` of a row is 0 (a pad query, ``o = 0``) the row is 0.

Differences from llm-transparency-tool (``routes/contributions.py``), on purpose: it adds
the residual stream as one more part (whole = ``resid_mid``) and clips at ``1e-5``
instead of 0, so that every part gets a small positive share; here the whole is the
attention output only (the same ``o`` as the contribution weights, so the two rank the
same entries of the same whole) and entries with ``a = 0`` get exactly 0.

Cost: ``||o - z_ij||_1`` is not a function of inner products, so it needs the
``d_model``-sized difference of every (head, query, key): ``O(batch * heads * n^2 *
d_model)`` operations per layer, ``d_model / d_head`` times a contribution weight's
``O(batch * heads * n^2 * d_head)``. That is the peers' price. Memory stays bounded: the
differences are built for a block of queries at a time (at most ``max_elements``
numbers), and keys after the last nonzero attention entry of the block (a causal mask)
are skipped, which is exact (``a = 0`` gives ``p = 0``).
"""

import torch

DEFAULT_MAX_ELEMENTS = 1 << 24  # 64 MB of float32 per block of differences


def alti_weights(geometry, kind: str = "inter", max_elements: int = DEFAULT_MAX_ELEMENTS) -> torch.Tensor:
    """ALTI proximities ``[batch, head_index, query_pos, key_pos]`` of one layer's
    :class:`~cwlens.core.AttentionGeometry` (see the module docstring for the math)."""
    from cwlens.core.geometry import check_kind, safe_divide

    check_kind(kind)
    a = geometry.pattern
    b, h, q, k = a.shape
    v_heads = geometry.v.repeat_interleave(geometry.group, dim=2)  # [b, k, h, d]
    v_tilde = torch.einsum("bkhd,hdm->bhkm", v_heads, geometry.W_O)  # [b, h, k, m]
    d_model = v_tilde.shape[-1]
    if kind == "inter":
        whole = geometry.layer_output[:, None]  # [b, 1, q, m]
    else:
        whole = geometry.head_outputs().permute(0, 2, 1, 3)  # [b, h, q, m]
    out = torch.zeros_like(a)
    per_query = max(1, b * h * k * d_model)
    step = max(1, max_elements // per_query)
    for start in range(0, q, step):
        stop = min(q, start + step)
        block = a[:, :, start:stop]
        used = block.ne(0).flatten(0, 2).any(0).nonzero()
        if not len(used):
            continue
        width = int(used.max()) + 1  # keys after it have a = 0 in every row: p = 0
        o = whole[:, :, start:stop, None, :]  # [b, h or 1, c, 1, m]
        diff = block[..., :width, None] * v_tilde[:, :, None, :width]  # z: [b, h, c, width, m]
        dist = diff.sub_(o).abs_().sum(-1)  # ||z - o||_1
        del diff
        norm = o.abs().sum(-1)  # ||o||_1: [b, h or 1, c, 1]
        out[:, :, start:stop, :width] = (norm - dist).clamp_min_(0)
    total = out.sum(-1, keepdim=True) if kind == "intra" else out.sum((1, 3), keepdim=True)
    return safe_divide(out, total)
