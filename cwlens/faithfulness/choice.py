"""Multiple-choice scoring by log-likelihood, as lm-eval-harness does it.

For choice ``c`` of an item with context ``x_c`` and continuation ``y_c``:

    ll_c       = sum_t log P(y_c[t] | x_c, y_c[:t])          (summed log-likelihood)
    acc        = [argmax_c ll_c == gold]
    acc_norm   = [argmax_c ll_c / len(y_c) == gold]          (len in characters, as lm-eval)

Tokens, as lm-eval-harness's ``_encode_pair``: trailing whitespace of ``x_c`` moves to
the front of ``y_c``; then ``whole = encode(x_c + y_c)``, ``ctx = encode(x_c)`` (each as
the model tokenizes a text: **with its BOS token** where TransformerLens prepends one, as
it does by default for SmolLM2, Gemma, Qwen and Llama; ``prepend_bos=False`` leaves it out,
for a model trained without one -- it changes the scores: SmolLM2's capitals accuracy is
36/40 with it and 38/40 without, ``tests/test_choice_bos.py``) and the continuation's tokens are
``whole[len(ctx):]`` -- not ``encode(y_c)``, which differs wherever tokens merge across
the boundary (SentencePiece and BPE tokenizers). The model reads
``input_c = (x_c + y_c)[:-1]`` -- the last continuation token is only a target. Choices
whose inputs are identical (MMLU and BoolQ: one-token continuations after the same
context) share one sequence, so an MMLU item costs one forward row, not four; masks
are built on, and applied to, every query position of that input.
"""

from dataclasses import dataclass

import torch

from cwlens.engine import lm, validation
from cwlens.engine.handle import ModelHandle
from cwlens.errors import DatasetFormatError, NonFiniteError


@dataclass(frozen=True)
class ChoiceRequest:
    """One choice: the input it is read from, where its continuation starts, its tokens."""

    item: int  # index of the item in the list given to :func:`encode_items`
    choice: int
    input_ids: tuple[int, ...]  # (context + continuation)[:-1]
    start: int  # input position whose logits predict the first continuation token
    continuation_ids: tuple[int, ...]
    continuation_chars: int


def text_ids(handle: ModelHandle, text: str, prepend_bos: bool = True) -> list[int]:
    """Token ids of ``text`` as the model makes them, never cut at the context:
    with the BOS token TransformerLens prepends by default (``prepend_bos=True``,
    :func:`~cwlens.engine.tokens.token_ids`) or without it (``prepend_bos=False``: for a
    model trained without one)."""
    validation.flag(prepend_bos, "prepend_bos")
    return handle.token_ids(text, truncate=False, prepend_bos=prepend_bos).tolist()


def encode_pair(handle: ModelHandle, context: str, continuation: str,
                prepend_bos: bool = True) -> tuple[list[int], list[int]]:
    """``(context_ids, continuation_ids)`` split from the encoded whole, as lm-eval does;
    the context starts with the model's BOS unless ``prepend_bos=False`` (:func:`text_ids`)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    # not cut at the context: a cut would drop the continuation (or its last tokens) and
    # score what is left; an item longer than the context is refused whole (units._fits_context)
    whole = text_ids(handle, context + continuation, prepend_bos)
    ctx = text_ids(handle, context, prepend_bos)
    return ctx, whole[len(ctx):]


def encode_items(handle: ModelHandle, items, prepend_bos: bool = True) -> list[ChoiceRequest]:
    """Requests of every choice of every :class:`~cwlens.datasets.ChoiceItem`
    (``prepend_bos``: :func:`encode_pair`)."""
    requests = []
    for index, item in enumerate(items):
        for choice, (context, continuation) in enumerate(item.pairs):
            ctx, cont = encode_pair(handle, context, continuation, prepend_bos)
            if not ctx:
                raise DatasetFormatError(
                    f"{item.id}: choice {choice} has an empty context and "
                    + ("the model adds no BOS token" if prepend_bos else "prepend_bos=False (--no-bos) "
                       "leaves out the BOS token")
                    + ", so nothing predicts the first continuation token."
                )
            if not cont:
                raise DatasetFormatError(f"{item.id}: choice {choice} has an empty continuation.")
            full = ctx + cont
            requests.append(
                ChoiceRequest(index, choice, tuple(full[:-1]), len(ctx) - 1, tuple(cont),
                              len(continuation))
            )
    return requests


def unique_inputs(requests: list[ChoiceRequest]) -> tuple[list[tuple[int, ...]], list[int]]:
    """``(inputs, which)``: the distinct input sequences (first-seen order) and, per
    request, the index of its input."""
    index: dict[tuple[int, ...], int] = {}
    which = [index.setdefault(r.input_ids, len(index)) for r in requests]
    return list(index), which


def read_positions(reqs, which, rows, offsets) -> list[tuple[int, int]]:
    """The ``(row, position)`` pairs whose logits score ``reqs`` (request ``r`` on input
    ``which[r]``, in batch row ``rows[which[r]]`` starting at ``offsets[which[r]]``)."""
    return [(rows[w], offsets[w] + r.start + t)
            for r, w in zip(reqs, which, strict=True) for t in range(len(r.continuation_ids))]


def continuation_ll(logits, row: int, offset: int, request: ChoiceRequest) -> torch.Tensor:
    """``ll`` of one request, a float64 scalar tensor (differentiable where ``logits``
    is), from logits ``[batch, pos, vocab]`` of a (left-)padded batch (or their
    :class:`~cwlens.engine.lm.Unembedded` residual); ``offset`` is the position of the
    input's first token in that row."""
    n = len(request.continuation_ids)
    pos = offset + request.start + torch.arange(n)
    picked = lm.logits_at(logits, row, pos)
    if bool(torch.isnan(picked).any() | torch.isposinf(picked).any()):  # (-inf: a token ruled out)
        raise NonFiniteError(
            f"The logits of item {request.item}, choice {request.choice} (batch row {row}, "
            f"positions {pos.tolist()}) hold NaN or inf, so its log-likelihood is undefined and "
            "the item's answer would be arbitrary: fp16 overflow or a weight that is not "
            "finite. Run the model in float32, or find the parameter with torch.isfinite.")
    logp = torch.log_softmax(picked.double(), dim=-1)
    target = torch.tensor(request.continuation_ids, device=picked.device)
    return logp.gather(-1, target[:, None]).sum()


def continuation_logprob(logits, row: int, offset: int, request: ChoiceRequest) -> float:
    """:func:`continuation_ll` as a float."""
    return float(continuation_ll(logits, row, offset, request))


def margin_loss(logits, reqs, which, rows, offsets, gold: int) -> torch.Tensor:
    """The label's margin as a loss, ``-(ll_gold - mean_{c != gold} ll_c)``: what the
    supervised attention x gradient differentiates for a multiple-choice item (an entry
    scores high where removing it would shrink the gold answer's lead over the others)."""
    lls = [continuation_ll(logits, rows[w], offsets[w], r) for r, w in zip(reqs, which, strict=True)]
    others = [ll for c, ll in enumerate(lls) if c != gold]
    return -(lls[gold] - torch.stack(others).mean())


def item_scores(lls: list[float], chars: list[int], gold: int) -> dict[str, float]:
    """``acc``, ``acc_norm`` (first index wins ties, like ``numpy.argmax``) and
    ``gold_ll`` (summed log-likelihood of the gold continuation)."""
    norm = [ll / max(c, 1) for ll, c in zip(lls, chars, strict=True)]
    best = max(range(len(lls)), key=lambda c: (lls[c], -c))
    best_norm = max(range(len(norm)), key=lambda c: (norm[c], -c))
    return {
        "acc": float(best == gold),
        "acc_norm": float(best_norm == gold),
        "gold_ll": float(lls[gold]),
    }
