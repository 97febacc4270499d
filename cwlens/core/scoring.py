"""Next-token scoring of a model's logits: the per-token NLL that the faithfulness test
(:mod:`cwlens.engine.lm`) and the gradient scores (:mod:`cwlens.engine.gradients`)
both read. Pure torch: tensors in, tensors out."""

import torch


def token_nll(
    logits: torch.Tensor, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(nll, is_target)``, both ``[batch, pos - 1]``: ``nll[b, t]`` is the NLL of
    ``tokens[b, t + 1]`` (computed in ``dtype``, 0 where not a target); ``is_target`` is
    True where both it and its context token are real."""
    return on_targets(target_nll(logits[:, :-1], tokens[:, 1:], dtype), attention_mask)


def target_nll(logits: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype = torch.float32
               ) -> torch.Tensor:
    """``-log softmax(logits)[target]`` at each position (computed in ``dtype``):
    ``logits [..., d_vocab]``, ``targets [...]``."""
    logp = torch.log_softmax(logits.to(dtype), dim=-1)
    return -logp.gather(-1, targets[..., None].to(logp.device)).squeeze(-1)


def on_targets(nll: torch.Tensor, attention_mask: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(nll, is_target)`` of per-target NLLs ``[batch, pos - 1]``: 0 where the target or
    its context token is padding (``attention_mask`` 0)."""
    if attention_mask is None:
        is_target = torch.ones_like(nll, dtype=torch.bool)
    else:
        real = attention_mask.bool().to(nll.device)
        is_target = real[:, 1:] & real[:, :-1]
    # where, not a product: a pad row's NaN logits must not reach the sums (or gradients)
    return torch.where(is_target, nll, torch.zeros_like(nll)), is_target
