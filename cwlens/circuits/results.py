"""Head-level results and how two rankings agree (pure: tensors in, numbers out).

A :class:`HeadScores` is one number per (layer, head) with its name and what it means;
:func:`agreement` compares two of them with the Spearman rank correlation and the top-k
overlap, which is how :mod:`cwlens.circuits.compare` sets contribution and attention
scores against activation patching.
"""

from dataclasses import dataclass

import torch

from cwlens.engine import validation
from cwlens.errors import ShapeMismatchError


def head_label(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


@dataclass(frozen=True)
class HeadScores:
    """One score per attention head.

    Attributes:
        name: short name (``"contribution_share"``, ``"attention"``, ``"patching"``, ...).
        values: ``[layer, head_index]`` float64 tensor (CPU).
        description: what the number is, in words (shown in tables and figure titles).
    """

    name: str
    values: torch.Tensor
    description: str = ""

    @property
    def n_layers(self) -> int:
        return self.values.shape[0]

    @property
    def n_heads(self) -> int:
        return self.values.shape[1]

    @property
    def labels(self) -> list[str]:
        """``"L{layer}H{head}"`` in the row-major order of :meth:`flat`."""
        return [head_label(ly, h) for ly in range(self.n_layers) for h in range(self.n_heads)]

    def flat(self) -> torch.Tensor:
        return self.values.reshape(-1)

    def __getitem__(self, layer_head: tuple[int, int]) -> float:
        return float(self.values[layer_head])

    def top(self, k: int = 10, absolute: bool = False) -> list[tuple[str, float]]:
        """The ``k`` highest heads as ``(label, value)``, by value (or by ``|value|``)."""
        validation.positive_int(k, "k")
        flat = self.flat()
        key = flat.abs() if absolute else flat
        order = torch.argsort(key, descending=True, stable=True)[:k]
        labels = self.labels
        return [(labels[i], float(flat[i])) for i in order.tolist()]

    def rank_of(self, label: str) -> int:
        """1-based rank of a head by value (1 = highest)."""
        order = torch.argsort(self.flat(), descending=True, stable=True).tolist()
        return order.index(self.labels.index(label)) + 1

    def to_dataframe(self):
        """Long table: ``layer, head, label, <name>``."""
        import pandas as pd  # heavy: pandas, imported on use

        rows = [
            {"layer": ly, "head": h, "label": head_label(ly, h), self.name: float(self.values[ly, h])}
            for ly in range(self.n_layers)
            for h in range(self.n_heads)
        ]
        return pd.DataFrame(rows)


def ranks(x: torch.Tensor) -> torch.Tensor:
    """1-based ranks of a 1-D tensor, ties given their average rank (float64)."""
    x = x.double().reshape(-1)
    order = torch.argsort(x, stable=True)
    sorted_x = x[order]
    out = torch.empty_like(x)
    i, n = 0, len(x)
    while i < n:
        j = i
        while j + 1 < n and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        out[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman rank correlation (Pearson correlation of the tie-averaged ranks); NaN if
    either input is constant."""
    if a.numel() != b.numel():
        raise ShapeMismatchError(f"spearman: {a.numel()} values against {b.numel()}.")
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = ra.norm() * rb.norm()
    return float("nan") if den == 0 else float((ra @ rb) / den)


def top_k_overlap(a: torch.Tensor, b: torch.Tensor, k: int) -> float:
    """``|top_k(a) ∩ top_k(b)| / k`` with the top k taken by value (highest first)."""
    validation.positive_int(k, "k")
    k = min(k, a.numel())
    top_a = set(torch.argsort(a.reshape(-1), descending=True, stable=True)[:k].tolist())
    top_b = set(torch.argsort(b.reshape(-1), descending=True, stable=True)[:k].tolist())
    return len(top_a & top_b) / k


@dataclass(frozen=True)
class Agreement:
    """How well ``score`` ranks the heads like ``reference`` (e.g. patching).

    ``spearman`` is over all heads; most heads have effects near 0 whose order is noise,
    so ``spearman_top`` is over the union of the two top-``k`` sets only (the heads either
    ranking calls important).
    """

    score: str
    reference: str
    spearman: float
    spearman_top: float
    top_k_overlap: float
    k: int
    n_heads: int

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def agreement(score: HeadScores, reference: HeadScores, k: int = 10) -> Agreement:
    """Spearman correlation and top-``k`` overlap of two head scores over all heads."""
    validation.positive_int(k, "k")
    if score.values.shape != reference.values.shape:
        raise ShapeMismatchError(
            f"{score.name} is {tuple(score.values.shape)} but {reference.name} is "
            f"{tuple(reference.values.shape)} [layer, head]; score the same model and layers."
        )
    a, b = score.flat(), reference.flat()
    k = min(k, a.numel())
    union = sorted(set(torch.argsort(a, descending=True, stable=True)[:k].tolist())
                   | set(torch.argsort(b, descending=True, stable=True)[:k].tolist()))
    return Agreement(score.name, reference.name, spearman(a, b), spearman(a[union], b[union]),
                     top_k_overlap(a, b, k), k, a.numel())
