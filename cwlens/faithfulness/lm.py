"""Language-modelling scores: per-token NLL, perplexity and ΔPPL, on padded batches.

A document's tokens are ``t_0 .. t_{n-1}`` (``t_0`` is the BOS where the model adds one);
every real token after the first is a target: ``nll_t = -log P(t_t | t_<t)``. Then
``PPL = exp(mean_t nll_t)`` per document and ``ΔPPL = PPL(masked) - PPL(clean)``.
"""

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


def document_scores(
    logits: torch.Tensor, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> list[dict[str, float]]:
    """Per document ``{"nll": mean token NLL, "ppl": exp(nll), "n_tokens": targets}``."""
    nll, is_target = token_nll(logits, tokens, attention_mask)
    counts = is_target.sum(-1)
    mean = (nll.double().sum(-1) / counts.clamp_min(1)).cpu()
    return [
        {"nll": float(m), "ppl": float(torch.exp(m)), "n_tokens": int(c)}
        for m, c in zip(mean, counts.cpu(), strict=True)
    ]
