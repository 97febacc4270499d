"""How well a method's edge weights agree with the true effects of removing the edges
(:func:`cwlens.groundtruth.edge_effects`), over one layer's edges at one query. Pure torch.

For weights ``w`` and true effects ``e`` over the same edges:

- ``spearman_abs``: Spearman's rank correlation of ``|w|`` and ``|e|`` (does the method
  rank the edges by how much they matter?);
- ``spearman_signed``: of ``w`` and ``e`` (does a negative weight mark an edge that works
  against the prediction?);
- ``topk_recall[k]``: the share of the ``k`` edges of largest ``|e|`` among the ``k`` of
  largest ``|w|``;
- ``captured[k]``: ``sum |e|`` over the method's top ``k`` (by ``|w|``) divided by ``sum
  |e|`` over the true top ``k``: 1 when the method's top ``k`` are the right edges, less
  when they matter less.

Ties are ranked by midranks (Spearman) and by position for the top-k (``torch.topk``
order, stable over equal values: the lower edge index first). NaN where undefined (a
constant vector has no rank correlation; an all-zero truth has nothing to capture).
"""

from collections.abc import Sequence

import torch

from cwlens.core.ranking_scores import midranks

KS: tuple[int, ...] = (1, 5, 10)


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rho of two 1-D tensors (midranks for ties; NaN if either is constant or
    there are fewer than 2 values)."""
    if a.numel() < 2:
        return float("nan")
    ra, rb = midranks(a.double()), midranks(b.double())
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = (ra.square().sum() * rb.square().sum()).sqrt()
    return float((ra * rb).sum() / den) if float(den) > 0 else float("nan")


def top(values: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest values, ties to the lower index."""
    order = torch.sort(values, descending=True, stable=True).indices
    return order[:k]


def agreement(weights: torch.Tensor, effect: torch.Tensor, ks: Sequence[int] = KS) -> dict:
    """The scores of the module docstring for one set of edges (1-D, same length)."""
    if weights.shape != effect.shape or weights.ndim != 1:
        raise ValueError(f"weights {tuple(weights.shape)} and effects {tuple(effect.shape)} must be "
                         "1-D of one length")
    w, e = weights.double(), effect.double()
    finite = torch.isfinite(w).all()
    out: dict = {"n_edges": int(e.numel()),
                 "spearman_abs": spearman(w.abs(), e.abs()) if finite else float("nan"),
                 "spearman_signed": spearman(w, e) if finite else float("nan"),
                 "topk_recall": {}, "captured": {}}
    for k in ks:
        kk = min(k, e.numel())
        truth = top(e.abs(), kk)
        best = float(e.abs()[truth].sum())
        if not finite or kk == 0:
            out["topk_recall"][k] = out["captured"][k] = float("nan")
            continue
        picked = top(w.abs(), kk)
        out["topk_recall"][k] = len(set(picked.tolist()) & set(truth.tolist())) / kk
        out["captured"][k] = float(e.abs()[picked].sum()) / best if best > 0 else float("nan")
    return out


def captured_curve(weights: torch.Tensor, effect: torch.Tensor, k_max: int) -> torch.Tensor:
    """``[k_max]``: ``captured[k]`` for k = 1..k_max (the figure's curve); NaN where a
    weight is not finite (a method undefined for the objective), as in :func:`agreement`."""
    e = effect.double().abs()
    if not torch.isfinite(weights).all():
        return torch.full((k_max,), float("nan"), dtype=torch.float64)
    best = torch.sort(e, descending=True, stable=True).values.cumsum(0)
    picked = e[torch.sort(weights.double().abs(), descending=True, stable=True).indices].cumsum(0)
    k = min(k_max, e.numel())
    out = torch.full((k_max,), float("nan"), dtype=torch.float64)
    ok = best[:k] > 0
    out[:k][ok] = picked[:k][ok] / best[:k][ok]
    return out
