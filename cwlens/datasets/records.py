"""Record types produced by the loaders.

``TextSample``  -- one document for language-modelling evaluation (perplexity).
``ChoiceItem``  -- one multiple-choice item scored like lm-eval-harness: the
score of choice ``i`` is ``log P(continuations[i] | contexts[i])``, and the
prediction is the argmax over choices. ``contexts`` has one entry per choice
because Winogrande's partial evaluation uses a different context per option;
for MMLU and BoolQ the same context is repeated.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TextSample:
    """A language-modelling document.

    Attributes:
        id: stable id, ``"<dataset>-<row index, 4+ digits>"``, e.g. ``"gsm8k-0000"``.
        text: the text to score (see ``cwlens.datasets.tasks`` for per-dataset formats).
        dataset: the dataset name it came from.
    """

    id: str
    text: str
    dataset: str


@dataclass(frozen=True)
class ChoiceItem:
    """A multiple-choice item: ``contexts[i] + continuations[i]`` is option ``i``.

    Attributes:
        id: stable id, e.g. ``"mmlu-0000"``.
        contexts: one conditioning string per choice.
        continuations: one scored continuation per choice (with its leading space,
            as lm-eval-harness's target delimiter adds it).
        gold: index of the correct choice.
        dataset: the dataset name it came from.
    """

    id: str
    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int
    dataset: str

    def __post_init__(self) -> None:
        if len(self.contexts) != len(self.continuations):
            raise ValueError(
                f"{self.id}: {len(self.contexts)} contexts but "
                f"{len(self.continuations)} continuations"
            )
        if len(self.continuations) < 2:
            raise ValueError(f"{self.id}: a choice item needs at least 2 choices")
        if isinstance(self.gold, bool) or not 0 <= self.gold < len(self.continuations):
            raise ValueError(
                f"{self.id}: gold={self.gold!r} is not a choice index "
                f"0..{len(self.continuations) - 1}"
            )

    @property
    def num_choices(self) -> int:
        return len(self.continuations)

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        """``(context, continuation)`` per choice, in choice order."""
        return tuple(zip(self.contexts, self.continuations, strict=True))
