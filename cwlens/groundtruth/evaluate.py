"""Run a compiled program's inputs through every method and score them against its truth:
:func:`evaluate` (per-input rows) and :func:`score_program` (those rows and the summary).

Inputs are drawn by the program's own sampler (``program.sample_inputs(n, seed)``), run in
batches of equal length through a float64 copy of the model (:func:`float64_copy`), and
the truth comes from the program (``program.truth``), not from the network. Activation patching reads, for each input, a *corrupted* input of the
same length in which every token after the BOS is replaced by another vocabulary token
(seeded), so every position's token differs.
"""

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cwlens.circuits.compare import circuit_cache
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import wrap
from cwlens.errors import InvalidArgumentError
from cwlens.groundtruth import scoring
from cwlens.groundtruth.agreement import check_agreement
from cwlens.groundtruth.codec import encode
from cwlens.groundtruth.input_scores import input_scores
from cwlens.groundtruth.layer_scores import ZERO_OUTPUT, component_scores, layer_scores
from cwlens.groundtruth.methods import answers_of
from cwlens.groundtruth.padding import padding_heads
from cwlens.runs.progress import new_bar

DEFAULT_INPUTS = 256
MIN_INPUTS = 3  # the bootstrap-t needs three (cwlens.core.bootstrap.MIN_N)


@dataclass(frozen=True)
class ProgramScores:
    """What :func:`score_program` returns.

    Attributes:
        program: the program's name.
        n_inputs: inputs scored.
        per_input: one row per input, method and scope (:data:`scoring.COLUMNS`).
        summary: one row per method and scope (:func:`scoring.summarize`).
        output_mismatches: inputs whose network output differs from the program's, where
            the program has an output: always 0, since :func:`evaluate` refuses a program
            whose network disagrees (:func:`cwlens.groundtruth.agreement.check_agreement`).
        silent_row_threshold: the ``||o||`` (times the layer's largest ``||v~||``) at or
            below which a row's output-normalised scores are 0
            (:func:`cwlens.groundtruth.layer_scores.silent_rows`).
    """

    program: str
    n_inputs: int
    per_input: Any
    summary: Any
    output_mismatches: int = 0
    silent_row_threshold: float = ZERO_OUTPUT


@takes_model
def all_scores(model: ModelLike, tokens: torch.Tensor, corrupted: torch.Tensor,
               zero_output: float = ZERO_OUTPUT) -> tuple[dict, torch.Tensor]:
    """``({level: {method: [batch, ...]}}, logits)`` of every method on ``tokens``;
    ``zero_output``: the silent-row threshold (:func:`~cwlens.groundtruth.layer_scores.silent_rows`)."""
    logits, cache = circuit_cache(model, tokens)
    answers = answers_of(logits)
    out = {"layer": layer_scores(model, tokens, cache, answers, zero_output),
           "input": input_scores(model, tokens, cache, answers),
           "component": component_scores(model, tokens, cache, answers, corrupted, zero_output)}
    return out, logits


def float64_copy(model):
    """A float64 copy of ``model`` for scoring (float32 weights are exact in float64), so
    that no score depends on float32 rounding: where a row's attention output is only the
    softmax's leak, its squared norm can underflow to a subnormal float32 (the test model's
    ``e^-50`` leak: 1 / ||o||^2 then overflows and the contribution weights are NaN)."""
    return copy.deepcopy(model).to(torch.float64)


def corrupt(inputs: Sequence[Sequence], vocab: Sequence, seed: int) -> list[list]:
    """Each input with every token after the first (BOS) replaced by a different vocabulary
    token drawn at random (seeded)."""
    vocab = list(vocab)
    if len(vocab) < 2:
        raise InvalidArgumentError(
            f"activation patching needs a vocabulary of two tokens or more to corrupt an input; "
            f"this program's is {vocab}.")
    g = torch.Generator().manual_seed(seed)
    out = []
    for row in inputs:
        new = [row[0]]
        for token in row[1:]:
            others = [v for v in vocab if v != token]
            new.append(others[int(torch.randint(len(others), (1,), generator=g))])
        out.append(new)
    return out


def evaluate(program: Any, n_inputs: int = DEFAULT_INPUTS, seed: int = 0, batch_size: int = 32,
             progress: bool = False, zero_output: float = ZERO_OUTPUT) -> tuple[list[dict], int]:
    """Per-input rows (:data:`scoring.COLUMNS`) of every method on ``n_inputs`` inputs of
    ``program`` (a :class:`~cwlens.groundtruth.library.CompiledProgram`), and the number
    of inputs whose network output differs from the program's (0: a program whose network
    disagrees with it on an input is refused, naming the input). ``zero_output``: the
    silent-row threshold (:func:`~cwlens.groundtruth.layer_scores.silent_rows`; 0: only
    exactly-zero outputs).

    Raises:
        InvalidArgumentError: ``n_inputs`` below 3, or the network disagrees with the
            program (:func:`~cwlens.groundtruth.agreement.check_agreement`).
    """
    if isinstance(zero_output, bool) or not isinstance(zero_output, int | float) or not 0 <= zero_output < 1:
        raise InvalidArgumentError(
            f"zero_output must be a number in [0, 1) (the silent-row threshold, {ZERO_OUTPUT} by "
            f"default; 0 scores without it); got {zero_output!r}.")
    if isinstance(n_inputs, bool) or not isinstance(n_inputs, int) or n_inputs < MIN_INPUTS:
        raise InvalidArgumentError(
            f"n_inputs must be an int >= {MIN_INPUTS} (the bootstrap intervals need three "
            f"inputs; the shipped tables use {DEFAULT_INPUTS}); got {n_inputs!r}.")
    handle = wrap(float64_copy(program.model))
    causal = not handle.is_encoder
    inputs = program.sample_inputs(n_inputs, seed=seed)
    truths = program.truth(inputs)
    check_agreement(program, inputs, [t.output for t in truths])
    corrupted = corrupt(inputs, program.vocab, seed + 1)
    heads = scoring.component_labels(program.components, handle.n_layers, handle.n_heads)
    scored_heads = ~padding_heads(handle)  # tracr's zero-weight padding heads: in no score
    groups: dict[int, list[int]] = {}
    for i, row in enumerate(inputs):
        groups.setdefault(len(row), []).append(i)
    batches = [ids[s:s + batch_size] for _, ids in sorted(groups.items())
               for s in range(0, len(ids), batch_size)]
    rows: list[dict] = []
    bar = _bar(len(inputs), program.name, progress)
    for ids in batches:
        tokens = encode(handle, [inputs[i] for i in ids])
        bad = encode(handle, [corrupted[i] for i in ids])
        scores, _ = all_scores(handle, tokens, bad, zero_output)
        for b, i in enumerate(ids):
            truth = truths[i]
            one = {lv: {m: v[b] for m, v in per.items()} for lv, per in scores.items()}
            for r in scoring.score_input(truth, one, heads, causal, scored_heads):
                rows.append({"program": program.name, "input_id": i, "length": len(inputs[i]), **r})
        bar.update(len(ids))
    bar.close()
    return rows, 0


def score_program(program: Any, n_inputs: int = DEFAULT_INPUTS, seed: int = 0,
                  batch_size: int = 32, progress: bool = False, n_boot: int = 1999,
                  zero_output: float = ZERO_OUTPUT) -> ProgramScores:
    """:func:`evaluate` and :func:`scoring.summarize` of one program."""
    rows, mismatches = evaluate(program, n_inputs, seed, batch_size, progress, zero_output)
    per_input = scoring.per_input_frame(rows)
    return ProgramScores(program.name, n_inputs, per_input,
                         scoring.summarize(per_input, n_boot=n_boot, seed=seed), mismatches,
                         zero_output)


def _bar(total: int, name: str, on: bool):
    """The inputs' progress bar (:func:`cwlens.runs.progress.new_bar`: on stderr, where it is
    a terminal), or a stand-in that draws nothing."""
    bar = new_bar(total, f"{name}: inputs", "input", enabled=on)
    return bar if bar is not None else _NoBar()


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass
