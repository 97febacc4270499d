"""Language-modelling scores: per-token NLL, perplexity and ΔPPL, on padded batches.

A document's tokens are ``t_0 .. t_{n-1}`` (``t_0`` is the BOS where the model adds one);
every real token after the first is a target: ``nll_t = -log P(t_t | t_<t)``. Then
``PPL = exp(mean_t nll_t)`` per document and ``ΔPPL = PPL(masked) - PPL(clean)``.

Long inputs are scored without ``[batch, pos, d_vocab]`` logits (3.2 GB at 16384 tokens
of a 49k vocabulary): above :data:`CHUNKED_ABOVE` positions the forward pass stops before
the unembedding (:func:`deferred_logits`) and keeps the final residual
``[batch, pos, d_model]`` (:class:`Unembedded`); the logits are then made, log-softmaxed
and read :data:`CHUNK` positions at a time. Every score here takes either logits or an
:class:`Unembedded` (an :data:`LMOutput`); both give the same numbers up to float32
rounding of the unembedding's matrix product.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from cwlens.core import scoring
from cwlens.engine.handle import ModelHandle

CHUNKED_ABOVE = 2048  # sequences longer than this are scored in chunks (no [pos, vocab] logits)
CHUNK = 256  # positions unembedded at once on the chunked path


@dataclass(frozen=True)
class Unembedded:
    """A forward pass's output kept before the unembedding: the final residual
    ``[batch, pos, d_model]`` and ``to_logits`` (``[..., d_model] -> [..., d_vocab]``,
    :meth:`cwlens.engine.handle.ModelHandle.logits_of`), applied ``chunk`` positions at a time
    (never with gradients)."""

    residual: torch.Tensor
    to_logits: Callable[[torch.Tensor], torch.Tensor]
    chunk: int = CHUNK

    @property
    def n_positions(self) -> int:
        return int(self.residual.shape[1])

    def rows(self, start: int, stop: int) -> "Unembedded":
        return replace(self, residual=self.residual[start:stop])

    def logits(self, start: int, stop: int) -> torch.Tensor:
        """Logits of positions ``start:stop`` of every row, ``[batch, stop - start, d_vocab]``."""
        with torch.no_grad():
            return self.to_logits(self.residual[:, start:stop])


@dataclass(frozen=True)
class Picked:
    """The logits of a few ``(row, position)`` pairs of a batch, made from its
    :class:`Unembedded` residual in one matrix product (one small product per pair reads
    the whole unembedding each time: slower than full logits for a 262k vocabulary)."""

    index: dict  # (row, position) -> row of ``logits``
    logits: torch.Tensor  # [pairs, d_vocab]

    @classmethod
    def of(cls, out: Unembedded, pairs) -> "Picked":
        pairs = sorted(set(pairs))
        if not pairs:
            return cls({}, out.residual.new_zeros(0, 0))
        rows = torch.tensor([r for r, _ in pairs], device=out.residual.device)
        positions = torch.tensor([p for _, p in pairs], device=out.residual.device)
        with torch.no_grad():
            logits = out.to_logits(out.residual[rows, positions][None])[0]
        return cls({pair: i for i, pair in enumerate(pairs)}, logits)


LMOutput = torch.Tensor | Unembedded  # logits [batch, pos, d_vocab], or their residual


def chunk_for(n_positions: int) -> int | None:
    """The positions per chunk for inputs of ``n_positions`` (None: whole logits)."""
    return CHUNK if n_positions > CHUNKED_ABOVE else None


@contextmanager
def deferred_logits(handle: ModelHandle, chunk: int | None) -> Iterator[Callable[[torch.Tensor], LMOutput]]:
    """Forwards inside skip the unembedding where ``chunk`` is given (else nothing changes);
    the yielded ``output(logits)`` is then the last forward's :class:`Unembedded`
    (else ``logits`` itself). Call it after the forward, inside or after the block."""
    if chunk is None:
        yield lambda logits: logits
        return
    with handle.unembedding_skipped() as caught:
        yield lambda _: Unembedded(caught[-1], handle.logits_of, chunk)


def rows(out: LMOutput, start: int, stop: int) -> LMOutput:
    """Rows ``start:stop`` of a batch's output."""
    return out.rows(start, stop) if isinstance(out, Unembedded) else out[start:stop]


def logits_at(out: LMOutput | Picked, row: int, positions: torch.Tensor) -> torch.Tensor:
    """``[len(positions), d_vocab]`` logits of one row at ``positions`` (ascending, contiguous)."""
    if isinstance(out, Picked):
        return out.logits[[out.index[(row, int(p))] for p in positions]]
    if isinstance(out, Unembedded):
        first = int(positions[0])
        return out.rows(row, row + 1).logits(first, first + len(positions))[0]
    return out[row, positions.to(out.device)]


def _nll(out: Unembedded, tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    n = out.n_positions
    parts = [scoring.target_nll(out.logits(s, min(s + out.chunk, n - 1)), tokens[:, s + 1 : s + 1 + out.chunk], dtype)
             for s in range(0, n - 1, out.chunk)]
    if not parts:
        return out.residual.new_zeros(out.residual.shape[0], 0, dtype=dtype)
    return torch.cat(parts, dim=1)


def token_nll(
    logits: LMOutput, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`cwlens.core.scoring.token_nll` (``(nll, is_target)``, both ``[batch, pos - 1]``)
    of logits, or of an :class:`Unembedded` chunk by chunk (without gradients)."""
    if not isinstance(logits, Unembedded):
        return scoring.token_nll(logits, tokens, attention_mask, dtype)
    return scoring.on_targets(_nll(logits, tokens, dtype), attention_mask)


def document_scores(
    logits: LMOutput, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> list[dict[str, float]]:
    """Per document ``{"nll": mean token NLL, "ppl": exp(nll), "n_tokens": targets}``."""
    nll, is_target = token_nll(logits, tokens, attention_mask)
    counts = is_target.sum(-1)
    mean = (nll.double().sum(-1) / counts.clamp_min(1)).cpu()
    return [
        {"nll": float(m), "ppl": float(torch.exp(m)), "n_tokens": int(c)}
        for m, c in zip(mean, counts.cpu(), strict=True)
    ]
