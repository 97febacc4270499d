"""A synthetic ContributionGraph of any size (random edges of a causal graph), for the
viewer's scale tests: a real 4,096-token build of SmolLM2 takes minutes on a CPU."""

import numpy as np

from cwlens.graphs.result import ContributionGraph


def synthetic_graph(n_layers: int = 30, n: int = 4096, top_k: int = 8, n_heads: int = 9,
                    seed: int = 0, metric: str = "contribution", compare: str | None = "attention",
                    ) -> ContributionGraph:
    rng = np.random.default_rng(seed)
    K = top_k + 1
    pos = np.arange(n)
    frm = (rng.random((n_layers, n, K)) * (pos[None, :, None] + 1)).astype(np.int32)
    frm[:, :, 0] = pos[None, :]
    frm[:, pos < top_k, :] = np.where(np.arange(K)[None, None, :] <= pos[None, pos < top_k, None],
                                      frm[:, pos < top_k, :], -1)
    heads = (rng.standard_normal((n_layers, n, K, n_heads)) * 0.01).astype(np.float32)
    residual = rng.uniform(0.5, 1.0, (n_layers, n)).astype(np.float32)
    heads[frm < 0] = np.nan
    weight = heads.sum(-1)
    weight[:, :, 0] += residual
    order = np.argsort(-np.abs(np.nan_to_num(weight[:, :, 1:], nan=-1)), axis=-1)
    weight[:, :, 1:] = np.take_along_axis(weight[:, :, 1:], order, -1)
    frm[:, :, 1:] = np.take_along_axis(frm[:, :, 1:], order, -1)
    heads[:, :, 1:] = np.take_along_axis(heads[:, :, 1:], order[..., None], -2)
    share = np.full((n_layers, n, n_heads), 1.0 / n_heads, np.float32)
    factors = None
    factor_heads = None
    if metric == "contribution":
        factor_heads = np.argsort(-np.abs(np.nan_to_num(heads)), -1)[..., :3].astype(np.int16)
        factors = rng.uniform(0, 1, (*factor_heads.shape, 3)).astype(np.float32)
    other = None if compare is None else synthetic_graph(n_layers, n, top_k, n_heads, seed + 1, compare, None)
    words = ["the", " cat", " sat", " on", " a", " mat", ",", " and", " John", " Mary"]
    return ContributionGraph(
        tokens=tuple(words[i % len(words)] for i in range(n)), metric=metric,
        blocks=tuple(range(n_layers)), top_k=top_k, from_position=frm, weight=weight, heads=heads,
        residual=residual, attention=1 - residual, head_share=share, factor_heads=factor_heads,
        factors=factors, compare=other, model_name="synthetic")
