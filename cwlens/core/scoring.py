"""Next-token scoring of a model's logits: the per-token NLL that the faithfulness test
(:mod:`cwlens.faithfulness.lm`) and the gradient scores (:mod:`cwlens.engine.gradients`)
both read. Pure torch: tensors in, tensors out."""

import torch


def token_nll(
    logits: torch.Tensor, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(nll, is_target)``, both ``[batch, pos - 1]``: ``nll[b, t]`` is the NLL of
    ``tokens[b, t + 1]`` (computed in ``dtype``, 0 where not a target); ``is_target`` is
    True where both it and its context token are real."""
    logp = torch.log_softmax(logits[:, :-1].to(dtype), dim=-1)
    nll = -logp.gather(-1, tokens[:, 1:, None].to(logp.device)).squeeze(-1)
    if attention_mask is None:
        is_target = torch.ones_like(nll, dtype=torch.bool)
    else:
        real = attention_mask.bool().to(nll.device)
        is_target = real[:, 1:] & real[:, :-1]
    # where, not a product: a pad row's NaN logits must not reach the sums (or gradients)
    return torch.where(is_target, nll, torch.zeros_like(nll)), is_target
