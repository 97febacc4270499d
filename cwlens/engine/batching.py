"""Batches of texts of different lengths: padded tokens plus the attention mask.

Each text is tokenized alone (so BOS handling is exactly the model's own), then padded:
on the left for decoders (the last token of every row is real, as generation expects;
TransformerLens derives position ids from the mask), on the right for encoders. Pass the
mask to ``run_with_cache`` *and* to cwlens' measures: pad positions then get weight 0.
"""

import warnings
from collections.abc import Iterable

import torch

from cwlens.engine import validation
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle, ModelInfo
from cwlens.engine.tokens import token_ids as token_ids  # re-exported: callers import it here
from cwlens.errors import (
    CwlensWarning,
    EmptyInputError,
    InvalidArgumentError,
    UnknownOptionError,
    UsageError,
)

__all__ = ["batch_input", "fit_context", "pad_batch", "token_ids"]


@takes_model
def pad_batch(model: ModelLike, texts, padding_side: str | None = None, max_tokens: int | None = None):
    """``(tokens [batch, pos], attention_mask [batch, pos])`` for a list of texts or id lists.

    ``padding_side`` defaults to ``"left"`` for decoders and ``"right"`` for encoders;
    ``max_tokens`` truncates each sequence (keeping its start).

    Args:
        model: the TransformerLens model (its tokenizer and pad token are used).
        texts: a list of texts, or of token id lists.
        padding_side: ``"left"``, ``"right"`` or ``None`` (by the model, as above).
        max_tokens: keep at most this many tokens of each text (``None``: all).

    Returns:
        ``(tokens, attention_mask)``, both ``[batch, pos]`` on the model's device; the
        mask is 1 on real tokens.

    Raises:
        EmptyInputError: no texts, or a text without tokens.
        UnknownOptionError: a ``padding_side`` other than ``"left"`` or ``"right"``.
        InvalidArgumentError: a ``max_tokens`` below 1.

    Examples:
        >>> import cwlens, torch
        >>> from cwlens.engine.batching import pad_batch
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> tokens, mask = pad_batch(model, ["the cat sat on the mat", "a dog ran"])
        >>> mask.tolist()  # left-padded: the last token of every row is real
        [[1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1]]
        >>> logits, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
        >>> c = cwlens.contribution_weights(cache, model, 0, attention_mask=mask)
        >>> alone = cwlens.contribution_weights(cwlens.run_with_cache(model, "a dog ran")[1], model, 0)
        >>> torch.allclose(c[1, :, 3:, 3:], alone[0], atol=1e-5)  # as if run alone
        True
    """
    side = padding_side or model.padding_side
    if side not in ("left", "right"):
        raise UnknownOptionError(f"padding_side must be 'left' or 'right'; got {side!r}.")
    if max_tokens is not None and (isinstance(max_tokens, bool) or max_tokens < 1):
        raise InvalidArgumentError(
            f"max_tokens must be a positive number of tokens, or None for whole texts; "
            f"got {max_tokens!r}."
        )
    if isinstance(texts, str | bytes) or not isinstance(texts, Iterable):
        raise InvalidArgumentError(
            f"texts must be a list of texts or of token id lists; got {type(texts).__name__} "
            f"{texts!r:.60}: pass a list, e.g. ['the cat sat', 'a dog ran']"
            + (" (one text: [text])" if isinstance(texts, str) else ""))
    texts = list(texts)
    if not texts:
        raise EmptyInputError("No texts to batch: pass at least one text.")
    loose = [i for i, t in enumerate(texts) if isinstance(t, int | float) or
             (isinstance(t, torch.Tensor) and t.ndim == 0)]
    if loose:
        raise InvalidArgumentError(
            f"item {loose[0]} of texts is a single number ({texts[loose[0]]!r}): pass each text "
            "as a string, or its token ids as a list ([[1, 2, 3]] for one sequence)")
    rows = [
        model.token_ids(t) if isinstance(t, str) else torch.as_tensor(t).flatten().cpu()
        for t in texts
    ]
    empty = [i for i, r in enumerate(rows) if len(r) == 0]
    if empty:
        raise EmptyInputError(
            f"text {empty[0]} of the batch has no tokens: pass texts with at least one token."
        )
    if max_tokens is not None:
        rows = [r[:max_tokens] for r in rows]
    tokens, mask = pad_rows(rows, model.pad_id, side)
    return tokens.to(model.device), mask.to(model.device)


def pad_rows(rows: list, pad_id: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tokens, attention_mask)`` ``[len(rows), longest]`` on the CPU: the token-id rows
    (lists or 1-d tensors, none empty) padded with ``pad_id`` on ``side`` (``"left"`` or
    ``"right"``). Nothing is checked: :func:`pad_batch` checks a user's texts first; a
    study pads the units it tokenized itself (``pad_rows(ids, handle.pad_id, handle.padding_side)``)."""
    n = max(len(r) for r in rows)
    tokens = torch.full((len(rows), n), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for i, r in enumerate(rows):
        sl = slice(n - len(r), n) if side == "left" else slice(0, len(r))
        tokens[i, sl] = torch.as_tensor(r, dtype=torch.long)
        mask[i, sl] = 1
    return tokens, mask


def batch_input(handle: ModelHandle, input, attention_mask: torch.Tensor | None = None,
                what: str = "input"):
    """``(input, attention_mask)`` as a forward pass should get them: ``input`` checked
    (:func:`cwlens.engine.validation.run_input`), and a list of texts made into one batch
    of tokens, padded by :func:`pad_batch` (left for decoders, right for encoders) with the
    mask that goes with it. Every entry point that takes a list of texts runs through
    here (``cwlens.stream``, ``stream_reduce``, ``stream_geometry``, ``run_with_cache``), so
    pad positions are never counted as tokens: the mask reaches the model and the measures.

    The mask is ``None`` where nothing is padded (one text, texts of the same length, or
    tokens given without a mask); a text past a rotary model's context runs whole (with
    the warning of :func:`cwlens.engine.validation.model_input`), as a lone text does.

    Examples:
        >>> import cwlens
        >>> from cwlens.engine.batching import batch_input
        >>> from cwlens.testing import tiny_model
        >>> handle = cwlens.wrap(tiny_model("llama"))  # a real one: cwlens.load_model("smollm2-135m")
        >>> tokens, mask = batch_input(handle, ["the cat sat on the mat", "a dog ran"])
        >>> mask.tolist()  # what pad_batch gives: left-padded on a decoder
        [[1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1]]
        >>> batch_input(handle, ["the cat", "a dog"])[1] is None  # same length: no padding
        True
    """
    texts = validation.texts_of(input)
    if texts is None or len(texts) < 2 or attention_mask is not None:
        return validation.run_input(handle, input, attention_mask, what), attention_mask
    validation.model_input(handle, input, None, what)  # refusals and warnings, as for one text
    tokens, mask = pad_batch(handle, [handle.token_ids(t, False) for t in texts])
    return tokens, (None if bool(mask.all()) else mask)


def check_past_context(info: ModelInfo, past_context: bool) -> bool:
    """``past_context`` (a bool) if the model (``info``: its
    :attr:`~cwlens.engine.handle.ModelHandle.info`) can take it: running past ``n_ctx`` needs
    rotary positions; a model with learned position embeddings has no position there
    (:class:`~cwlens.errors.UsageError`: the command line exits 2)."""
    validation.flag(past_context, "past_context")
    if past_context and not info.rotary:
        raise UsageError(
            f"--past-context (past_context=True) needs rotary positions, but {info.name or 'this model'} "
            f"has learned position embeddings with no position past its context of "
            f"{info.n_ctx} tokens (n_ctx): leave it out (texts are then cut at n_ctx).")
    return past_context


PAST_NOTE = "(--past-context: rotary positions the model never saw in training)"


def fit_context(handle: ModelHandle, tokens: torch.Tensor, max_tokens: int | None, what: str,
                past_context: bool = False) -> torch.Tensor:
    """``tokens[:, :max_tokens]``, cut further to the model's context (``n_ctx``) with a
    :class:`~cwlens.errors.CwlensWarning` when the text is longer (docs/inputs.md).
    ``past_context`` (rotary models only, :func:`check_past_context`): not cut at ``n_ctx``;
    the warning says it runs past the trained context."""
    validation.max_tokens(max_tokens)
    check_past_context(handle.info, past_context)
    n = tokens.shape[-1]
    if max_tokens is not None:
        tokens = tokens[:, :max_tokens]
    limit = handle.context_length()
    if limit is not None and tokens.shape[-1] > limit:
        if past_context:
            warnings.warn(f"{what} has {tokens.shape[-1]} tokens, past the model's context "
                          f"(n_ctx) of {limit}: running all of them {PAST_NOTE}", CwlensWarning,
                          stacklevel=3)
            return tokens
        warnings.warn(f"{what} has {n} tokens and the model's context (n_ctx) is {limit}: using "
                      f"its first {limit} tokens", CwlensWarning, stacklevel=3)
        tokens = tokens[:, :limit]
    return tokens


def context_cap(info: ModelInfo, max_tokens: int | None, lengths, what: str = "texts",
                past_context: bool = False) -> int | None:
    """The truncation length to use: ``max_tokens``, lowered to the model's (``info``) context
    (``n_ctx``) with one :class:`~cwlens.errors.CwlensWarning` when some of ``lengths``
    (the texts' token counts) would exceed it (docs/inputs.md). ``past_context`` (rotary
    models only): ``max_tokens`` as it is, and the one warning says that some run past
    the trained context."""
    check_past_context(info, past_context)
    limit = info.n_ctx
    if limit is None or (max_tokens is not None and max_tokens <= limit):
        return max_tokens
    lengths = list(lengths)
    long = sum(1 for n in lengths if n > limit)
    some = f"{long} of the {len(lengths)} {what} {'is' if long == 1 else 'are'}"
    them, their = ("it", "its") if long == 1 else ("them", "their")
    if past_context:
        if long:
            running = "whole" if max_tokens is None else f"up to {their} first {max_tokens} tokens"
            warnings.warn(f"{some} longer than the model's context (n_ctx) of {limit} tokens: "
                          f"running {them} {running} {PAST_NOTE}", CwlensWarning, stacklevel=3)
        return max_tokens
    if long:
        warnings.warn(f"{some} longer than the model's context (n_ctx) of {limit} tokens: "
                      f"using {their} first {limit}", CwlensWarning, stacklevel=3)
    return limit
