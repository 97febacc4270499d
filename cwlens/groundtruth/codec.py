"""Inputs and outputs of a compiled program: :func:`encode` (tokens -> ids) and
:func:`decode` (logits or final residual -> tracr's ``decoded``)."""

from collections.abc import Sequence
from typing import Any

import torch

from cwlens.engine.models.tracr_network import TracrTransformer
from cwlens.errors import (
    EmptyInputError,
    InputTooLongError,
    InvalidArgumentError,
    ShapeMismatchError,
)


def model_of(model: Any) -> TracrTransformer:
    """The :class:`TracrTransformer` of a model, its cwlens handle or a ``CompiledProgram``."""
    inner = getattr(model, "model", model)  # a handle or a CompiledProgram
    if not isinstance(inner, TracrTransformer):
        raise InvalidArgumentError(
            f"expected a compiled program's model (cwlens.groundtruth.from_tracr(assembled) or "
            f"cwlens.groundtruth.load(name)); got {type(model)}.")
    return inner


def check_input(model: Any, tokens: Sequence) -> list[int]:
    """The ids of one input (BOS first), or the matching error."""
    m = model_of(model)
    layout = m.layout
    if isinstance(tokens, str) or not isinstance(tokens, Sequence):
        raise InvalidArgumentError(
            f"an input is a list of tokens, BOS first, e.g. [{layout.bos!r}, "
            f"{layout.input_tokens[-1]!r}]; got {type(tokens).__name__} {tokens!r:.60}.")
    if len(tokens) == 0:
        raise EmptyInputError(
            f"the input is empty: every input starts with the BOS {layout.bos!r} (tracr's "
            f"compiler_bos), e.g. [{layout.bos!r}, {layout.input_tokens[-1]!r}].")
    if tokens[0] != layout.bos:
        raise InvalidArgumentError(
            f"the input starts with {tokens[0]!r}: every input starts with the BOS "
            f"{layout.bos!r} (tracr's compiler_bos): pass [{layout.bos!r}, *tokens].")
    if len(tokens) - 1 > layout.max_seq_len:
        raise InputTooLongError(
            f"the input has {len(tokens) - 1} tokens after the BOS, more than this program's "
            f"max_seq_len {layout.max_seq_len}: pass at most {layout.max_seq_len} (or compile "
            "the program with a larger max_seq_len).")
    vocab = [t for t in layout.input_tokens if t not in (layout.bos, layout.pad)]
    for i, token in enumerate(tokens[1:], start=1):
        if token in (layout.bos, layout.pad) or (token not in vocab and str(token) not in map(str, vocab)):
            raise InvalidArgumentError(
                f"token {token!r} at position {i} is not in this program's vocabulary {vocab}: "
                "pass tokens of the vocabulary after the BOS.")
    return [m.tokenizer.id_of(t) for t in tokens]


def encode(model: Any, tokens: Sequence) -> torch.Tensor:
    """Token ids of inputs: ``[1, n]`` for one input (a list of tokens, BOS first), or
    ``[batch, n]`` for a list of inputs of one length.

    Args:
        model: the compiled program's model (or the ``CompiledProgram``).
        tokens: ``["BOS", "x", "y"]`` (vocabulary values or their strings), or a list of such.

    Returns:
        ``[1, n]`` or ``[batch, n]`` token ids (torch.long) on the model's device.

    Raises:
        InvalidArgumentError: a first token other than the BOS, or a token outside the
            vocabulary (the message names it and the vocabulary).
        InputTooLongError: more than ``max_seq_len`` tokens after the BOS.
        ShapeMismatchError: inputs of different lengths in one batch.
    """
    m = model_of(model)
    batch = bool(tokens) and not isinstance(tokens, str) and all(
        isinstance(t, Sequence) and not isinstance(t, str) for t in tokens)
    rows = [check_input(m, t) for t in (tokens if batch else [tokens])]
    if len({len(r) for r in rows}) > 1:
        raise ShapeMismatchError(
            f"the inputs have {sorted({len(r) for r in rows})} tokens: encode stacks inputs of "
            "one length; encode each alone, or group them by length.")
    return torch.tensor(rows, dtype=torch.long, device=m.W_E.device)


def decode(model: Any, output: torch.Tensor) -> list:
    """Tracr's ``decoded`` of logits ``[batch, n, d_vocab_out]`` or of the final residual
    ``[batch, n, d_model]`` (unembedded here): the BOS first, then the categorical output
    values (argmax, as tracr) or the numerical outputs as floats.

    Args:
        model: the compiled program's model (or the ``CompiledProgram``).
        output: logits or final residual, ``[batch, n, ...]`` or ``[n, ...]``.

    Returns:
        One list for a 2-D output or a batch of one; a list of lists for a larger batch.
        Where the program wrote no value (:func:`written` is False) the argmax picks among
        float noise, as tracr's does.

    Raises:
        ShapeMismatchError: a last axis that is neither the logits' nor the residual's.
    """
    m = model_of(model)
    layout = m.layout
    if not isinstance(output, torch.Tensor) or output.ndim not in (2, 3):
        raise ShapeMismatchError(
            f"decode takes the logits [batch, n, {m.cfg.d_vocab_out}] or the final residual "
            f"[batch, n, {m.cfg.d_model}] of this model; got "
            f"{tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__}.")
    x = output if output.ndim == 3 else output[None]
    if x.shape[-1] == m.cfg.d_model and x.shape[-1] != m.cfg.d_vocab_out:
        x = m.unembed(x.to(m.W_U.dtype).to(m.W_U.device))
    elif x.shape[-1] != m.cfg.d_vocab_out:
        raise ShapeMismatchError(
            f"the last axis has {x.shape[-1]} entries; this model's logits have "
            f"{m.cfg.d_vocab_out} and its residual stream {m.cfg.d_model}.")
    rows = []
    for row in x.detach().cpu():
        if layout.output_values is None:
            values: list = [float(v) for v in row[:, 0]]
        else:
            values = [layout.output_values[int(i)] for i in row.argmax(-1)]
        rows.append([layout.bos, *values[1:]])
    return rows[0] if len(rows) == 1 else rows


WRITTEN = 0.5  # a categorical output the program wrote is a one-hot of magnitude ~1


def written(model: Any, logits: torch.Tensor) -> torch.Tensor:
    """Where the program wrote an output value: ``[batch, n]`` (or ``[n]``) bool.

    A categorical output is a one-hot of magnitude 1 in the output directions; where the
    program has no value (RASP's None: a query that matched nothing), every output logit is
    zero up to float noise (~1e-8), and the argmax of :func:`decode` (tracr's) picks
    whichever value the noise favours: such positions are compared as "nothing written",
    not by value. Numerical outputs are always written (0 is a value).
    """
    m = model_of(model)
    if m.layout.output_values is None:
        return torch.ones(logits.shape[:-1], dtype=torch.bool)
    return logits.detach().max(-1).values.cpu() > WRITTEN
