"""Small checks and safe arithmetic shared by the core modules (:mod:`cwlens.core.geometry`,
:mod:`cwlens.core.alti`, :mod:`cwlens.core.sinks`), kept apart so that none of them imports
another both ways. Pure torch."""

import math

import torch

from cwlens.core._types import KINDS, Kind
from cwlens.errors import NonFiniteError, UnknownOptionError


def check_kind(kind: str) -> Kind:
    if kind not in KINDS:
        raise UnknownOptionError(
            f"Unknown kind={kind!r}. Valid kinds: 'intra' (project on the head's own output, "
            f"rows sum to 1 per head) or 'inter' (project on the layer's multi-head output, "
            f"sums to 1 over heads and keys)."
        )
    return kind  # narrowed to Kind by the check above


def safe_divide(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` where ``den > 0``, else 0 (never NaN or inf)."""
    ok = den > 0
    return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num))


def _where(layer: int | None) -> str:
    return "" if layer is None else f" in layer {layer}"


def check_finite(tensor: torch.Tensor, what: str, layer: int | None = None,
                 head_dim: int | None = None, fix: str = "") -> None:
    """Raise :class:`~cwlens.errors.NonFiniteError` if ``tensor`` holds NaN or inf,
    naming ``what``, the layer and, where ``head_dim`` is given, the heads affected.

    One reduction (``isfinite(tensor.sum())``: no tensor of the input's size). A sum is
    finite when every term is, unless finite terms overflow; that case is told apart by
    an elementwise check made only then, so the error is never a false alarm.
    """
    if tensor.numel() == 0 or bool(torch.isfinite(tensor.sum())):
        return
    bad = ~torch.isfinite(tensor)
    if not bool(bad.any()):
        return  # finite terms whose sum overflows: every entry is a number
    kinds = [name for name, on in (("NaN", bool(torch.isnan(tensor).any())),
                                   ("inf", bool(torch.isinf(tensor).any()))) if on]
    heads = ""
    if head_dim is not None and tensor.ndim > head_dim:
        per_head = bad.transpose(0, head_dim).reshape(tensor.shape[head_dim], -1).any(-1)
        idx = per_head.nonzero().flatten().tolist()
        heads = f", head{'s' if len(idx) > 1 else ''} {', '.join(map(str, idx[:8]))}" + (
            " ..." if len(idx) > 8 else "")
    raise NonFiniteError(
        f"{' and '.join(kinds)} in {what}{_where(layer)}{heads}. "
        + (fix or "Non-finite activations usually mean fp16 overflow (run the model in float32 "
           "or bfloat16) or broken weights (check the model's parameters with "
           "torch.isfinite).")
    )


def worst(values, highest: bool = True) -> float:
    """The largest (``highest``) or smallest of ``values``, NaN if any of them is NaN
    (Python's ``max``/``min`` silently drop a NaN that is not first: ``max(1e-7, nan)`` is
    ``1e-7``, so a broken layer would pass a worst-of check); NaN for no values."""
    values = [float(v) for v in values]
    if not values or any(math.isnan(v) for v in values):
        return math.nan
    return max(values) if highest else min(values)
