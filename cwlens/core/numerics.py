"""Small checks and safe arithmetic shared by the core modules (:mod:`cwlens.core.geometry`,
:mod:`cwlens.core.alti`, :mod:`cwlens.core.sinks`), kept apart so that none of them imports
another both ways. Pure torch."""

import torch

from cwlens.core._types import KINDS, Kind
from cwlens.errors import UnknownOptionError


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
