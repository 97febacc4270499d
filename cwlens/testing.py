"""Reference implementations for tests: slow, float64, and deliberately naive.

They build the per-pair vectors ``a_ij v~_j^h`` (``[batch, head, query, key, d_model]``)
that the fast path never builds, so use them only at small sizes.
"""

import torch


def naive_measures(pattern, v, W_O, position_mask=None) -> dict[str, torch.Tensor]:
    """All measures of one layer, straight from the definitions, in float64.

    Returns a dict with ``attention``, ``value_weighted``,
    ``value_weighted_output_normalized_{intra,inter}``, ``contribution_{intra,inter}``,
    ``relative_norm_{intra,inter}``, ``cosine_{intra,inter}``, ``head_outputs`` and
    ``layer_output``.
    """
    a = pattern.double()
    if position_mask is not None:
        m = position_mask.double()
        a = a * m[:, None, :, None] * m[:, None, None, :]
    n_heads, n_kv = a.shape[1], v.shape[2]
    v_heads = v.double().repeat_interleave(n_heads // n_kv, dim=2)  # [b, k, h, d]
    v_tilde = torch.einsum("bkhd,hdm->bhkm", v_heads, W_O.double())  # projected values
    pairs = a[..., None] * v_tilde[:, :, None, :, :]  # [b, h, q, k, m]  (the big one)
    o_head = pairs.sum(3)  # [b, h, q, m]
    o = o_head.sum(1)  # [b, q, m]
    out = {"attention": a, "head_outputs": o_head.permute(0, 2, 1, 3), "layer_output": o}
    v_norm = v_tilde.norm(dim=-1)[:, :, None, :]  # [b, h, 1, k]
    out["value_weighted"] = a * v_norm
    for kind, target in (("intra", o_head), ("inter", o[:, None].expand_as(o_head))):
        t = target[:, :, :, None, :]  # [b, h, q, 1, m]
        t_norm = target.norm(dim=-1)[..., None]  # [b, h, q, 1]
        ok = t_norm > 0
        safe = torch.where(ok, t_norm, torch.ones_like(t_norm))
        zero = torch.zeros_like(a)
        out[f"contribution_{kind}"] = torch.where(ok, (pairs * t).sum(-1) / safe**2, zero)
        out[f"value_weighted_output_normalized_{kind}"] = torch.where(
            ok, a * v_norm / safe, zero
        )
        out[f"relative_norm_{kind}"] = torch.where(ok, v_norm / safe, zero)
        cos = torch.nn.functional.cosine_similarity(
            t.expand(*pairs.shape[:-1], t.shape[-1]),
            v_tilde[:, :, None, :, :].expand_as(pairs),
            dim=-1,
            eps=1e-300,
        )
        out[f"cosine_{kind}"] = torch.where(ok & (v_norm > 0), cos, zero)
    return out


def random_layer(
    batch=2, n_heads=4, n_kv=2, pos=7, d_head=5, d_model=12, seed=0, dtype=torch.float32
):
    """A random causal pattern, values and W_O of consistent shapes."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, n_heads, pos, pos, generator=g, dtype=dtype)
    causal = torch.ones(pos, pos, dtype=torch.bool).tril()
    pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    v = torch.randn(batch, pos, n_kv, d_head, generator=g, dtype=dtype)
    W_O = torch.randn(n_heads, d_head, d_model, generator=g, dtype=dtype)
    return pattern, v, W_O
