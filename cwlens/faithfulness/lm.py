"""Language-modelling scores: per-token NLL, perplexity and ΔPPL, on padded batches.

A document's tokens are ``t_0 .. t_{n-1}`` (``t_0`` is the BOS where the model adds one);
every real token after the first is a target: ``nll_t = -log P(t_t | t_<t)``. Then
``PPL = exp(mean_t nll_t)`` per document and ``ΔPPL = PPL(masked) - PPL(clean)``.
"""

import torch

from cwlens.core.scoring import token_nll as token_nll  # re-exported: it lives in core


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
