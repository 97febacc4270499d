"""The reference top-k of the TopK reducer, from the full tensors: each row ranked among
the keys its query attends to (real query and key, ``j <= i`` on a decoder, inside a
sliding window), the rest of the ``k`` entries marked index -1 / value NaN."""

import torch

from cwlens.engine.handle import wrap


def attended(model, n: int, layer: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``[batch or 1, 1, n, n]`` bool: True where query ``i`` attends to key ``j``."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    ok = torch.ones(n, n, dtype=torch.bool)
    if not wrap(model).is_encoder:
        ok = j <= i
        window = wrap(model).attention_window(layer)
        if window is not None:
            ok = ok & (j > i - window)
    ok = ok[None, None]
    if mask is not None:
        m = mask.bool().cpu()
        ok = ok & m[:, None, :, None] & m[:, None, None, :]
    return ok


def reference_topk(full: torch.Tensor, model, k: int, by_abs: bool = False,
                   mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, valid)`` of the top-k of ``full`` ``[layer, batch, head, query, key]``."""
    n = full.shape[-1]
    ok = torch.stack([attended(model, n, ly, mask) for ly in range(full.shape[0])])
    score = (full.abs() if by_abs else full).masked_fill(~ok, float("-inf"))
    top = score.topk(min(k, n), dim=-1)
    valid = top.values > float("-inf")
    return full.gather(-1, top.indices).masked_fill(~valid, float("nan")), valid


def check_topk(result, full: torch.Tensor, model, k: int, by_abs: bool = False,
               mask: torch.Tensor | None = None, **tol) -> None:
    """``result`` (a TopKResult) holds the reference values, its indices point at them, its
    marked entries are exactly the reference's, and no index is a key left out."""
    want, valid = reference_topk(full, model, k, by_abs, mask)
    torch.testing.assert_close(result.values, want, equal_nan=True, **tol)
    assert torch.equal(result.valid, valid)
    idx = result.indices.long()
    torch.testing.assert_close(full.gather(-1, idx.clamp_min(0)).masked_fill(~valid, float("nan")),
                               result.values, equal_nan=True, **tol)
    n = full.shape[-1]
    ok = torch.stack([attended(model, n, ly, mask) for ly in range(full.shape[0])])
    picked = ok.expand(full.shape).gather(-1, idx.clamp_min(0))
    assert bool(picked[valid].all()), "a key the query does not attend to was returned"
