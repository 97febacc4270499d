"""Row schemas and prompt formats, one block per dataset.

Language modelling (``TextSample``):
  gsm8k        text = "Question: {question}\\nAnswer: {answer}". The answer is the
               official solution verbatim, including the ``<<calc>>`` annotations and
               the final "#### <number>" line. Scoring question and worked solution
               together keeps the perplexity signal on natural reasoning text; the
               "Question:/Answer:" labels match lm-eval-harness's gsm8k prompt.
  fineweb_edu  text = the document, verbatim.
  fineweb_edu_substitute_wikipedia  text = "<title>\\n<paragraph>" as stored (a
               Wikipedia substitute, NOT FineWeb-Edu; kept under its own name).

Multiple choice (``ChoiceItem``), exactly lm-eval-harness's default tasks (target
delimiter " ", few-shot delimiter "\\n\\n"):
  mmlu         context = "The following are multiple choice questions (with answers)
               about {subject with spaces}.\\n\\n" + k exemplars + question block, where
               a question block is "{question.strip()}\\nA. {c0}\\nB. {c1}\\nC. {c2}\\n
               D. {c3}\\nAnswer:" and an exemplar is a block + " {gold letter}\\n\\n".
               Exemplars are the first k dev rows of the same subject (lm-eval's
               ``first_n`` sampler). continuations = (" A", " B", " C", " D").
  winogrande   partial evaluation: for option j, context = sentence[:i] + option_j
               where i is the index of "_"; continuation = " " + sentence[i+1:].strip()
               (the same for both options). gold = int(answer) - 1.
  boolq        context = "{passage}\\nQuestion: {question}?\\nAnswer:";
               continuations = (" no", " yes"); gold = int(answer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .jsonl import Field, Schema, int_in, is_bool, is_str, one_of, str_containing, str_list
from .records import ChoiceItem

GSM8K_SCHEMA = Schema((Field("question", "str", is_str), Field("answer", "str", is_str)))
TEXT_SCHEMA = Schema((Field("text", "str", is_str),))
MMLU_SCHEMA = Schema(
    (
        Field("question", "str", is_str),
        Field("choices", "list of 4 str", str_list(4)),
        Field("answer", "int 0-3", int_in(0, 3)),
        Field("subject", "str (snake_case, e.g. abstract_algebra)", is_str),
    )
)
WINOGRANDE_SCHEMA = Schema(
    (
        Field("sentence", 'str containing "_"', str_containing("_")),
        Field("option1", "str", is_str),
        Field("option2", "str", is_str),
        Field("answer", 'str "1" or "2"', one_of("1", "2")),
    )
)
BOOLQ_SCHEMA = Schema(
    (
        Field("question", "str", is_str),
        Field("passage", "str", is_str),
        Field("answer", "bool", is_bool),
    )
)

MMLU_LETTERS = ("A", "B", "C", "D")
MMLU_CONTINUATIONS = tuple(f" {letter}" for letter in MMLU_LETTERS)
BOOLQ_CONTINUATIONS = (" no", " yes")
MMLU_MAX_FEWSHOT = 5


def make_id(dataset: str, index: int) -> str:
    """Stable id from the row's 0-based position in its source, e.g. ``gsm8k-0000``."""
    return f"{dataset}-{index:04d}"


# --- language modelling ---------------------------------------------------


def gsm8k_text(row: Mapping[str, Any]) -> str:
    return f"Question: {row['question']}\nAnswer: {row['answer']}"


def document_text(row: Mapping[str, Any]) -> str:
    return row["text"]


# --- MMLU ---------------------------------------------------------------


def mmlu_description(subject: str) -> str:
    subject_words = subject.replace("_", " ")
    return f"The following are multiple choice questions (with answers) about {subject_words}.\n\n"


def mmlu_question_block(row: Mapping[str, Any]) -> str:
    lines = [row["question"].strip()]
    lines += [
        f"{letter}. {choice}" for letter, choice in zip(MMLU_LETTERS, row["choices"], strict=True)
    ]
    return "\n".join(lines) + "\nAnswer:"


def mmlu_exemplar(row: Mapping[str, Any]) -> str:
    return f"{mmlu_question_block(row)} {MMLU_LETTERS[row['answer']]}\n\n"


def mmlu_fewshot_pool(dev_rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Dev rows grouped by subject, in file order."""
    pool: dict[str, list[Mapping[str, Any]]] = {}
    for row in dev_rows:
        pool.setdefault(row["subject"], []).append(row)
    return pool


def mmlu_context(row: Mapping[str, Any], exemplars: Sequence[Mapping[str, Any]] = ()) -> str:
    shots = "".join(mmlu_exemplar(ex) for ex in exemplars)
    return mmlu_description(row["subject"]) + shots + mmlu_question_block(row)


def mmlu_item(
    item_id: str,
    row: Mapping[str, Any],
    dataset: str,
    exemplars: Sequence[Mapping[str, Any]] = (),
) -> ChoiceItem:
    context = mmlu_context(row, exemplars)
    return ChoiceItem(
        id=item_id,
        contexts=(context,) * len(MMLU_CONTINUATIONS),
        continuations=MMLU_CONTINUATIONS,
        gold=row["answer"],
        dataset=dataset,
    )


# --- Winogrande -----------------------------------------------------------


def winogrande_split(sentence: str, option: str) -> tuple[str, str]:
    """Partial-evaluation ``(context, continuation)`` for one option."""
    blank = sentence.index("_")
    return sentence[:blank] + option, " " + sentence[blank + 1 :].strip()


def winogrande_item(item_id: str, row: Mapping[str, Any], dataset: str) -> ChoiceItem:
    pairs = [winogrande_split(row["sentence"], row[key]) for key in ("option1", "option2")]
    return ChoiceItem(
        id=item_id,
        contexts=tuple(ctx for ctx, _ in pairs),
        continuations=tuple(cont for _, cont in pairs),
        gold=int(row["answer"]) - 1,
        dataset=dataset,
    )


# --- BoolQ ----------------------------------------------------------------


def boolq_context(row: Mapping[str, Any]) -> str:
    return f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:"


def boolq_item(item_id: str, row: Mapping[str, Any], dataset: str) -> ChoiceItem:
    context = boolq_context(row)
    return ChoiceItem(
        id=item_id,
        contexts=(context, context),
        continuations=BOOLQ_CONTINUATIONS,
        gold=int(row["answer"]),
        dataset=dataset,
    )
