"""Checks of user-given values shared by the API and the command line.

Each raises a :class:`~cwlens.errors.CwlensError` subclass whose message names the
argument, the value and what to pass instead.
"""

import math
import numbers
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from cwlens.engine.adapter import _layer_index
from cwlens.engine.handle import ModelHandle
from cwlens.engine.tokens import text_length
from cwlens.errors import (
    CwlensWarning,
    EmptyInputError,
    InputTooLongError,
    InvalidArgumentError,
    ShapeMismatchError,
)

_PAST_CONTEXT_SAID: ContextVar[bool] = ContextVar("cwlens_past_context_said", default=False)


@contextmanager
def past_context_said(said: bool = True) -> Iterator[None]:
    """Inside (where ``said``), an input past a rotary model's context runs without
    :func:`model_input`'s warning: the surface (``--past-context``) said so once already,
    so a sweep's many forward passes do not repeat it (docs/inputs.md)."""
    token = _PAST_CONTEXT_SAID.set(bool(said) or _PAST_CONTEXT_SAID.get())
    try:
        yield
    finally:
        _PAST_CONTEXT_SAID.reset(token)


def positive_int(value: object, name: str) -> int:
    """``value`` if it is an int >= 1 (bools refused), else :class:`InvalidArgumentError`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"{name} must be a positive integer (1, 2, ...); got {value!r}.")
    return value


def seed(value: object, name: str = "seed") -> None:
    """An integer (NumPy ints too; bools and floats refused: 1.5 is not a seed)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidArgumentError(f"{name} must be an integer; got {value!r}.")


def max_tokens(value: object, name: str = "max_tokens") -> int | None:
    """A truncation length: a positive int, or None for whole texts (0 and negatives refused:
    they would silently mean "everything" or "drop the end")."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(
            f"{name} must be a positive number of tokens (e.g. 128), or None for whole texts; "
            f"got {value!r}."
        )
    return value


def rate(value: object, name: str = "rate") -> float:
    """A fraction in [0, 1] (a finite float or int, not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be a number in [0, 1]; got {value!r}.")
    if not 0.0 <= value <= 1.0:
        raise InvalidArgumentError(
            f"{name} must be in [0, 1] (the fraction of entries removed); got {value!r}."
        )
    return float(value)


def text(value: object, name: str = "text") -> str:
    """A non-empty string (whitespace only counts as empty)."""
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be a string; got {type(value).__name__}.")
    if not value.strip():
        raise EmptyInputError(f"The {name} is empty: pass a text with at least one word.")
    return value


def flag(value: object, name: str) -> bool:
    """A bool (``True``/``False``; 0/1 and strings refused: ``"False"`` would be true)."""
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be True or False; got {value!r}.")
    return value


def label(value: object, name: str) -> str:
    """A non-empty string used as a name (a reducer's, a text id, ...)."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidArgumentError(f"{name} must be a non-empty string; got {value!r}.")
    return value


def int_list(value: object, name: str, allow_empty: bool = False) -> list[int]:
    """A list (or tuple, 1-d array) of ints, each once; a bare int, a string or floats refused."""
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        raise InvalidArgumentError(f"{name} must be a list of integers, e.g. [0, 1]; got {value!r}.")
    items = list(value)
    out = []
    for item in items:
        index = _layer_index(item)
        if index is None:
            raise InvalidArgumentError(f"{name} must hold integers; got {item!r} in {value!r}.")
        out.append(index)
    if not out and not allow_empty:
        raise EmptyInputError(f"{name} is empty: pass at least one integer, or None for all.")
    dup = sorted({x for x in out if out.count(x) > 1})
    if dup:
        raise InvalidArgumentError(f"{name} lists {dup} twice: give each once.")
    return out


def texts_of(input: object) -> list[str] | None:
    """``input`` as a list of texts if it is a text or a non-empty list (or tuple) of
    texts, else None (tokens, or something malformed)."""
    if isinstance(input, str):
        return [input]
    if isinstance(input, list | tuple) and input and all(isinstance(t, str) for t in input):
        return list(input)
    return None


def model_input(handle: ModelHandle, input: object, attention_mask=None, what: str = "input") -> int:
    """Check what a forward pass will get, before any model work; return its length in tokens.

    ``input``: a text, a non-empty list of texts (none blank) or integer token ids
    ``[pos]`` / ``[batch, pos]`` inside the vocabulary. ``attention_mask`` must have the
    tokens' shape. An input longer than the model's context (``n_ctx``) raises
    :class:`~cwlens.errors.InputTooLongError` where the model's positions are learned
    embeddings (GPT-2, BERT: no position exists past ``n_ctx``); with rotary positions
    (Llama, Mistral, Qwen, Gemma) it runs, with a :class:`~cwlens.errors.CwlensWarning`
    that it is past the trained context (see docs/inputs.md).
    """
    if isinstance(input, list | tuple) and not input:
        raise EmptyInputError(f"The {what} is an empty list of texts: pass at least one text.")
    texts = texts_of(input)
    tokens = None
    if texts is not None:
        empty = [i for i, t in enumerate(texts) if not t.strip()]
        if empty:
            where = "The input text" if isinstance(input, str) else f"Text {empty[0]} of the {what}"
            raise EmptyInputError(f"{where} is empty: pass a text with at least one word.")
        n = max(text_length(handle, t) for t in texts)
        if attention_mask is not None:
            if handle.is_encoder or len(texts) != 1:
                # several texts: the mask comes from pad_batch, which returns the tokens too
                raise ShapeMismatchError(
                    "An attention_mask needs tokens, not texts: pass the texts without a mask "
                    "(cwlens pads a list of texts with a mask of its own), or the tokens the "
                    "mask belongs to (tokens, mask = cwlens.engine.batching.pad_batch(model, texts))."
                )
            tokens = handle.to_tokens(texts[0])
    elif isinstance(input, torch.Tensor):
        tokens = input
        _check_token_ids(handle, tokens, what)
        n = int(tokens.shape[-1])
    else:
        raise InvalidArgumentError(
            f"The {what} must be a text, a list of texts or a [batch, pos] tensor of token ids; "
            f"got {type(input).__name__} {_short(input)}."
        )
    if attention_mask is not None and tokens is not None:
        if not isinstance(attention_mask, torch.Tensor):
            raise InvalidArgumentError(
                f"attention_mask must be a [batch, pos] tensor of 0/1; got {type(attention_mask).__name__}.")
        want = tuple(tokens.shape) if tokens.ndim == 2 else (1, tokens.shape[-1])
        if tuple(attention_mask.shape) != want:
            raise ShapeMismatchError(
                f"attention_mask is {tuple(attention_mask.shape)} but the tokens are "
                f"{tuple(tokens.shape)}: the mask must be [batch, pos] like the tokens it was "
                "made with (cwlens.engine.batching.pad_batch returns both)."
            )
        mask_values(attention_mask.reshape(want))
    limit = handle.context_length()
    if limit is not None and n > limit:
        if handle.rotary_positions:
            if not _PAST_CONTEXT_SAID.get():
                warnings.warn(
                    f"The {what} has {n} tokens, past this model's trained context of {limit} "
                    "(n_ctx): rotary positions run on, but the model never saw positions this "
                    "far (see docs/inputs.md).", CwlensWarning, stacklevel=3)
        else:
            raise InputTooLongError(
                f"The {what} has {n} tokens, more than this model's context of {limit} (n_ctx), "
                "and its learned position embeddings have no position past it: pass at most "
                f"{limit} tokens, e.g. tokens[:, :{limit}] (see docs/inputs.md)."
            )
    return n


def mask_values(attention_mask) -> None:
    """A ``[batch, pos]`` attention mask of 0 (padding) and 1 (real token), with at least
    one 1 in every row (what ``run_with_cache``, ``stream`` and the measures take)."""
    if not isinstance(attention_mask, torch.Tensor):
        raise InvalidArgumentError(
            f"attention_mask must be a [batch, pos] tensor of 0/1; got {type(attention_mask).__name__}"
            " (e.g. the mask of cwlens.engine.batching.pad_batch, or torch.tensor(your_list)).")
    if attention_mask.ndim != 2:
        raise ShapeMismatchError(f"attention_mask must be [batch, pos]; got shape "
                                 f"{tuple(attention_mask.shape)}.")
    if bool(((attention_mask != 0) & (attention_mask != 1)).any()):
        raise InvalidArgumentError("attention_mask must hold 0 (padding) and 1 (real token) only.")
    empty_rows = (attention_mask.sum(-1) == 0).nonzero().flatten().tolist()
    if empty_rows:
        raise EmptyInputError(
            f"attention_mask row {empty_rows[0]} has no real token (all 0): every row needs "
            "at least one 1.")


def run_input(handle: ModelHandle, input: object, attention_mask=None, what: str = "input") -> object:
    """``input`` checked by :func:`model_input`, as the forward pass should get it: texts
    past the context (rotary positions, with the warning) tokenized whole, since
    ``model(text)`` would cut them at ``n_ctx``."""

    n = model_input(handle, input, attention_mask, what)
    limit = handle.context_length()
    if limit is not None and n > limit and isinstance(input, str | list | tuple):
        return handle.to_tokens(list(input) if isinstance(input, tuple) else input,
                                     truncate=False)
    return input


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_token_ids(handle: ModelHandle, tokens, what: str) -> None:
    if tokens.ndim not in (1, 2):
        raise ShapeMismatchError(
            f"The {what} tokens are {tuple(tokens.shape)}: pass [pos] or [batch, pos] token ids.")
    if tokens.dtype == torch.bool or tokens.is_floating_point() or tokens.is_complex():
        raise InvalidArgumentError(
            f"The {what} tokens are {tokens.dtype}: token ids must be an integer tensor "
            "(torch.long), e.g. from model.to_tokens(text).")
    if tokens.numel() == 0:
        raise EmptyInputError(
            f"The {what} has no tokens (shape {tuple(tokens.shape)}): pass at least one text "
            "of at least one token."
        )
    vocab = handle.vocab_size()
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or (vocab is not None and high >= vocab):
        bad = low if low < 0 else high
        raise InvalidArgumentError(
            f"Token id {bad} in the {what} is outside this model's vocabulary 0..{(vocab or 1) - 1}: "
            "pass ids made by this model's tokenizer (model.to_tokens(text))."
        )


def unique_ids(ids, keyed: str) -> None:
    """Each sample id once: results ``keyed`` by sample id ("the rows", "the tables") would
    keep one sample of a repeated id, or mix them."""
    twice = [(i, n) for i, n in Counter(ids).items() if n > 1]
    if twice:
        i, n = twice[0]
        raise InvalidArgumentError(
            f"sample id {i!r} is given {n} times ({len(twice)} repeated id(s)): {keyed} are "
            "keyed by sample id; give each sample its own id.")
