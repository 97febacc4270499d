"""Chat prompts: MMLU and BoolQ as one user turn of an instruction-tuned model's chat template.

lm-eval's plain prompts (:mod:`cwlens.datasets.tasks`) end in "Answer:" and score " A" ..
" D" / " no", " yes": a base model's format. An instruction-tuned model trained on its
chat template reads the question as a user turn and answers in the assistant turn, so
the chat form (zero-shot) is::

    context       = chat(user)     the template with one user turn and the assistant
                                    header (e.g. "<|im_start|>assistant\\n"), given by
                                    the model (cwlens.wrap(model).chat_prompt)
    continuations = "A".."D"        (MMLU)   -- the assistant's first token, no space
                  = "No", "Yes"     (BoolQ)

  mmlu   user = "The following is a multiple choice question about {subject}.\\n\\n"
                "{question.strip()}\\nA. {c0}\\nB. {c1}\\nC. {c2}\\nD. {c3}\\n\\n"
                "Answer with the letter of the correct option (A, B, C or D)."
  boolq  user = "{passage}\\n\\nQuestion: {question}?\\n\\nAnswer with Yes or No."

Every choice of an item is one token read at the same position, so scoring is the
next-token log-probability of each letter / word (lm-eval's log-likelihood of a
one-token continuation). Winogrande (partial scoring of the sentence's end) and the
circuit tasks are language-modelling prompts with no chat form.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .records import ChoiceItem
from .tasks import MMLU_LETTERS

Chat = Callable[[str], str]  # user text -> the full prompt, ending in the assistant header
CHAT_DATASETS = ("mmlu", "boolq")
MMLU_CHAT_CONTINUATIONS = MMLU_LETTERS
BOOLQ_CHAT_CONTINUATIONS = ("No", "Yes")


def mmlu_chat_user(row: Mapping[str, Any]) -> str:
    options = "\n".join(f"{letter}. {choice}"
                        for letter, choice in zip(MMLU_LETTERS, row["choices"], strict=True))
    subject = row["subject"].replace("_", " ")
    return (f"The following is a multiple choice question about {subject}.\n\n"
            f"{row['question'].strip()}\n{options}\n\n"
            "Answer with the letter of the correct option (A, B, C or D).")


def boolq_chat_user(row: Mapping[str, Any]) -> str:
    return f"{row['passage']}\n\nQuestion: {row['question']}?\n\nAnswer with Yes or No."


def chat_item(item_id: str, row: Mapping[str, Any], dataset: str, chat: Chat) -> ChoiceItem:
    """The chat form of one ``mmlu`` or ``boolq`` row."""
    conts: tuple[str, ...]
    if dataset == "mmlu":
        user, conts, gold = mmlu_chat_user(row), MMLU_CHAT_CONTINUATIONS, row["answer"]
    else:
        user, conts, gold = boolq_chat_user(row), BOOLQ_CHAT_CONTINUATIONS, int(row["answer"])
    context = chat(user)
    return ChoiceItem(id=item_id, contexts=(context,) * len(conts), continuations=conts,
                      gold=gold, dataset=dataset)
