"""Accuracy under masking, only where the clean model is clearly above chance.

Accuracy under comprehensiveness / sufficiency masking (the paper's multiple-choice half)
says nothing about a metric when the clean model is at chance: masking cannot lower an
accuracy that is already a coin flip. So the test first measures the clean accuracy::

    acc     = (1/n) sum_items [argmax_c ll_c == gold]     (cwlens.faithfulness.choice)
              each choice's ll read after the model's BOS token (TransformerLens prepends
              one by default); prepend_bos=False (CLI --no-bos) reads it without one, for
              a model trained without a BOS (SmolLM2 capitals, first 40 items: 36/40 with
              it, 38/40 without; tests/test_choice_bos.py)
    uniform = (1/n) sum_items 1 / k_item                  (k: the item's number of choices)
    const   = max_s (1/n) sum_items [gold continuation == s]
              over the answers s offered in every item (BoolQ's " yes", MMLU's " A")
    chance  = max(uniform, const)

``const`` is what a model scores by always giving the same answer: on BoolQ's 63% "yes"
rows a model that always says yes would otherwise clear a 50% bar with no reading at all.
The answer ``s`` is picked after seeing the golds, which overstates chance on few items
(on one item it is 100%): below :data:`MIN_CONSTANT_ITEMS` items ``chance = uniform``
and the report line says so.

with its exact 95% interval (:func:`cwlens.core.proportion.clopper_pearson`), and runs
the masking sweep (:func:`~cwlens.faithfulness.run_faithfulness`) only if the interval's
lower end is above chance; otherwise it refuses with :class:`AtChanceError`
(``allow_chance=True`` runs it anyway and the result says "at chance").

    check = clean_accuracy(model, load_dataset("capitals"))
    print(check.line())      # capitals: 62.3% [55.3, 68.9] (129/207), chance 25.0%: above chance
    test = run_accuracy_test(model, "capitals", FaithfulnessConfig(rates=(0.1, 0.5)))
    test.result.summary()

The clean pass is one plain forward per batch (the batches of the sweep, left-padded);
its accuracy equals the sweep's clean ``acc`` rows. So a rerun that resumes a results
file (``out=``) reads the clean accuracy of the items already written from their rows
(:func:`written_accuracies`) and runs only the rest.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from cwlens.core.proportion import above_chance, clopper_pearson
from cwlens.datasets import ChoiceItem, load_dataset
from cwlens.engine import adapter
from cwlens.engine.batching import pad_batch
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle
from cwlens.errors import EmptyInputError, InvalidArgumentError
from cwlens.faithfulness.results import clean_values
from cwlens.faithfulness.sweep import (
    FaithfulnessConfig,
    dataset_name,
    run_faithfulness,
    stored_config,
)
from cwlens.faithfulness.units import choice_units, plan_batches
from cwlens.runs.progress import tick

MIN_CONSTANT_ITEMS = 20  # fewer items: the best constant answer is not estimated


class AtChanceError(InvalidArgumentError):
    """The clean accuracy's interval does not clear chance: masking would test nothing."""


@dataclass(frozen=True)
class CleanAccuracy:
    """Clean accuracy of one dataset: ``correct`` of ``n``, its exact interval at
    ``level``, and the chance level (:func:`chance_level`; ``constant``: the answer that
    sets it when always giving that answer beats uniform guessing, else None)."""

    dataset: str
    n: int
    correct: int
    chance: float
    low: float
    high: float
    level: float = 0.95
    constant: str | None = None
    reused: int = 0  # items read from a resumed run's rows, not run (clean_accuracy's known)

    @property
    def accuracy(self) -> float:
        return self.correct / self.n

    @property
    def above_chance(self) -> bool:
        return above_chance(self.low, self.chance)

    @property
    def verdict(self) -> str:
        return "above chance" if self.above_chance else "at chance"

    def line(self) -> str:
        return (f"{self.dataset}: {100 * self.accuracy:.1f}% [{100 * self.low:.1f}, "
                f"{100 * self.high:.1f}] ({self.correct}/{self.n}), chance "
                f"{100 * self.chance:.1f}%{self.chance_note()}: {self.verdict}")

    def chance_note(self) -> str:
        if self.constant is not None:
            return f" (always answering {self.constant.strip()!r})"
        if self.n < MIN_CONSTANT_ITEMS:
            return (f" (uniform guessing: with fewer than {MIN_CONSTANT_ITEMS} items no constant "
                    "answer is estimated)")
        return ""


def uniform_chance(items: Sequence) -> float:
    """Mean over the items of ``1 / number of choices``."""
    if not items:
        raise EmptyInputError("No items: pass at least one ChoiceItem.")
    return sum(1.0 / item.num_choices for item in items) / len(items)


def constant_answer(items: Sequence) -> tuple[str | None, float]:
    """``(answer, accuracy)`` of the best constant answer: among the continuations that
    every item offers exactly once, the one that is gold most often; ``(None, 0.0)`` when
    the items share no answer (capitals, IOI: each item has its own names)."""
    if not items:
        raise EmptyInputError("No items: pass at least one ChoiceItem.")
    shared = None
    for item in items:
        once = {c for c in item.continuations if item.continuations.count(c) == 1}
        shared = once if shared is None else shared & once
    if not shared:
        return None, 0.0
    hits = {s: sum(item.continuations[item.gold] == s for item in items) for s in sorted(shared)}
    best = max(hits, key=lambda s: hits[s])
    return best, hits[best] / len(items)


def chance_level(items: Sequence) -> float:
    """``max(uniform guessing, the best constant answer)`` (:func:`uniform_chance`,
    :func:`constant_answer`); uniform guessing alone below :data:`MIN_CONSTANT_ITEMS`
    items, where the constant answer, picked after seeing the golds, overstates chance."""
    return max(uniform_chance(items), _estimated_constant(items)[1])


def _estimated_constant(items: Sequence) -> tuple[str | None, float]:
    """:func:`constant_answer` on :data:`MIN_CONSTANT_ITEMS` items or more, else ``(None, 0.0)``."""
    return constant_answer(items) if len(items) >= MIN_CONSTANT_ITEMS else (None, 0.0)


def item_accuracies(handle: ModelHandle, items: Sequence, batch_tokens: int = 2048,
                    known: Mapping[str, float] | None = None,
                    prepend_bos: bool = True) -> list[float]:
    """``acc`` (1.0 / 0.0) of every item on the clean model, in item order (``prepend_bos``:
    each input starts with the model's BOS token, see the module docstring). ``known``:
    accuracies already measured, by item id (:func:`written_accuracies`); those items
    are not run again. Each batch ticks its items (:func:`cwlens.runs.progress.tick`)."""
    known = known or {}
    todo = [i for i, item in enumerate(items) if item.id not in known]
    acc = [float(known[item.id]) if item.id in known else float("nan") for item in items]
    units = choice_units(handle, [items[i] for i in todo], prepend_bos)
    for batch in plan_batches(units, batch_tokens):
        seqs: list = []
        rows_of: list[list[int]] = []
        for u in batch:
            rows_of.append(list(range(len(seqs), len(seqs) + len(units[u].sequences))))
            seqs += units[u].sequences
        tokens, mask = pad_batch(handle, seqs)
        offsets = mask.int().argmax(-1).tolist()
        with torch.no_grad():
            logits = handle(tokens, **handle.forward_kwargs(mask))
        for u, rows in zip(batch, rows_of, strict=True):
            score = units[u].score(logits, rows, [offsets[r] for r in rows], tokens, mask)
            acc[todo[u]] = score["acc"]
        tick(len(batch))
    return acc


def written_accuracies(handle: ModelHandle, items: Sequence, config, out, *,
                       model_name: str | None = None, num_fewshot: int = 0) -> dict[str, float]:
    """The clean ``acc`` of the items whose rows a masking run of ``config`` on ``items``
    has already written to ``out`` (its ``.jsonl`` / ``.jsonl.gz`` results file), by item
    id: the values that the rerun resuming it computes no more. Empty when ``out`` holds
    no rows of that run (:func:`~cwlens.faithfulness.results.clean_values`).
    ``model_name`` and ``num_fewshot`` as given to
    :func:`~cwlens.faithfulness.run_faithfulness`."""
    items = list(items)
    if out is None or not items:
        return {}
    name = model_name or handle.name or "model"
    expected = stored_config(name, dataset_name(items, num_fewshot), config, [i.id for i in items])
    return clean_values(out, expected)  # the stored samples are these items


@takes_model
def clean_accuracy(model: ModelLike, items: Sequence, level: float = 0.95,
                   batch_tokens: int = 2048,
                   known: Mapping[str, float] | None = None,
                   prepend_bos: bool = True) -> CleanAccuracy:
    """The clean accuracy of ``items`` (:class:`~cwlens.datasets.ChoiceItem`) on ``model``;
    ``known``: item accuracies already measured, by id (:func:`written_accuracies`: a
    resumed run's rows), which are read instead of run (``reused`` counts them).
    ``prepend_bos``: each choice is read after the model's BOS token (default, as
    TransformerLens tokenizes); False for a model trained without one."""
    items = list(items)
    if not items:
        raise EmptyInputError("No items: pass a non-empty list of ChoiceItem.")
    if not all(isinstance(i, ChoiceItem) for i in items):
        raise InvalidArgumentError(
            "clean_accuracy needs multiple-choice items (ChoiceItem, e.g. load_dataset('ioi')); "
            f"got a {type(next(i for i in items if not isinstance(i, ChoiceItem))).__name__}.")
    known = {i.id: known[i.id] for i in items if i.id in known} if known else {}
    wrong = {k: v for k, v in known.items() if v not in (0, 1)}
    if wrong:
        raise InvalidArgumentError(
            f"known holds accuracies other than 0 or 1 ({dict(list(wrong.items())[:3])}): an "
            "item's clean accuracy is 1.0 when its gold choice scores highest, else 0.0. Pass "
            "the values written_accuracies reads from a results file, or leave known out.")
    correct = int(sum(item_accuracies(model, items, batch_tokens, known, prepend_bos)))
    low, high = clopper_pearson(correct, len(items), level)
    answer, const = _estimated_constant(items)
    uniform = uniform_chance(items)
    return CleanAccuracy(items[0].dataset, len(items), correct, max(uniform, const), low, high,
                         level, answer if const > uniform else None, len(known))


def require_above_chance(check: CleanAccuracy) -> None:
    """Raise :class:`AtChanceError` unless ``check`` is clearly above chance."""
    if not check.above_chance:
        raise AtChanceError(
            f"{check.line()}: the lower end of the {100 * check.level:g}% interval does not "
            "clear chance, so accuracy under masking cannot tell the metrics apart. Use a "
            "task this model solves (cwlens.faithfulness.accuracy.clean_accuracy), or pass "
            "allow_chance=True to run_accuracy_test to run it anyway (CLI: leave out "
            "--require-above-chance).")


@dataclass(frozen=True)
class AccuracyTest:
    """The clean check and the masking sweep's result (its rows carry ``acc`` per condition)."""

    clean: CleanAccuracy
    result: object  # FaithfulnessResult


@takes_model
def run_accuracy_test(model: ModelLike, dataset, config=None, *, n: int | None = None,
                      allow_chance: bool = False, level: float = 0.95, **kwargs) -> AccuracyTest:
    """Clean accuracy first (:func:`clean_accuracy`); if it clears chance (or
    ``allow_chance``), the masking sweep :func:`~cwlens.faithfulness.run_faithfulness`
    with ``config`` on the same items (``kwargs``: its keywords, e.g. ``out``)."""
    items = load_dataset(dataset, n) if isinstance(dataset, str) else list(dataset)
    cfg = config or FaithfulnessConfig()
    adapter.require_metrics(model, cfg.metrics)  # before the clean pass
    known = written_accuracies(model, items, cfg, kwargs.get("out"),
                               model_name=kwargs.get("model_name"),
                               num_fewshot=kwargs.get("num_fewshot", 0)) \
        if kwargs.get("resume", True) else {}
    check = clean_accuracy(model, items, level, cfg.batch_tokens, known, cfg.prepend_bos)
    if not allow_chance:
        require_above_chance(check)
    return AccuracyTest(check, run_faithfulness(model, items, cfg, **kwargs))
