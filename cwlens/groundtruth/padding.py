"""tracr's padding heads: every layer of a compiled model has as many heads as its widest
layer, and the heads no operation uses have all-zero weights. Such a head attends
uniformly (its scores are all 0) and writes nothing: it is an artefact of the layout, not
a head of the program, so no score counts it (:mod:`cwlens.groundtruth.scoring` leaves
its entries out; :func:`without_padding` takes it out of attention rollout's head mean).
"""

from typing import Any

import torch

from cwlens.groundtruth.codec import model_of


def padding_heads(model) -> torch.Tensor:
    """``[layer, head]`` bool: the heads whose ``W_V`` or ``W_O`` is all zero (they write
    nothing, whatever they attend to) in a compiled program's model (or its handle, or a
    ``CompiledProgram``)."""
    attns: list[Any] = [block.attn for block in model_of(model).blocks]
    return torch.stack([zero_heads(a.W_V, a.W_O) for a in attns]).cpu()


def zero_heads(W_V: torch.Tensor, W_O: torch.Tensor) -> torch.Tensor:
    """``[head]`` bool: ``W_V [head, d_model, d_head]`` or ``W_O [head, d_head, d_model]``
    all zero."""
    return (W_V.detach() == 0).flatten(1).all(1) | (W_O.detach() == 0).flatten(1).all(1)


def without_padding(patterns: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """``patterns [layer, ..., head, q, k]`` with each padding head's pattern replaced so
    that the mean over heads is the mean over the layer's real heads: by that mean, or by
    the identity in a layer with no real head (its attention writes nothing, so the layer
    passes every position's stream on as it is). ``padding``: ``[layer, head]`` bool."""
    out = patterns.clone()
    n = patterns.shape[-1]
    eye = torch.eye(n, dtype=patterns.dtype, device=patterns.device)
    for layer, pad in enumerate(padding.to(torch.bool)):
        if not pad.any():
            continue
        real = ~pad
        fill = (patterns[layer][..., real.to(patterns.device), :, :].mean(-3)
                if real.any() else eye.expand(patterns[layer].shape[:-3] + (n, n)))
        out[layer][..., pad.to(patterns.device), :, :] = fill.unsqueeze(-3)
    return out
