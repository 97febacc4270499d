"""Task functions of the cwlens_* lm-eval tasks (loaded by lm-eval's ``!function`` tags).

The prompts are cwlens's own (:mod:`cwlens.datasets.tasks`), so each document's
``(context, continuation)`` requests are exactly the choices of the
:class:`~cwlens.datasets.ChoiceItem` that ``cwlens.load_dataset`` makes of the same row.
The continuations carry their leading space in the choice itself (``target_delimiter:
""``), so lm-eval's ``acc_norm`` divides by ``len(" no")`` as cwlens's does (lm-eval's
stock BoolQ would divide by ``len("no")``). The data are the shipped JSONL samples, read
with ``datasets.load_dataset("json", data_files=...)`` at their installed path (offline),
or a JSONL of the same fields given as ``data_file`` in lm-eval's ``--metadata``.
"""

from cwlens.datasets import tasks as fmt
from cwlens.datasets.registry import get_spec


def _load(name: str, data_file=None):
    """The ``test`` split: the shipped sample, or ``data_file`` (a JSONL with the same
    fields, e.g. ``--metadata '{"data_file": "my_boolq.jsonl"}'``)."""
    import datasets  # optional: HF datasets

    path = str(data_file) if data_file else str(get_spec(name).path)
    return datasets.load_dataset("json", data_files={"test": path})


def load_mmlu(data_file=None, **_):
    return _load("mmlu", data_file)


def load_winogrande(data_file=None, **_):
    return _load("winogrande", data_file)


def load_boolq(data_file=None, **_):
    return _load("boolq", data_file)


# --- MMLU (zero-shot: description + question block; choices " A".." D") ------


def mmlu_text(doc) -> str:
    return fmt.mmlu_context(doc)


def mmlu_choices(doc) -> list[str]:
    return list(fmt.MMLU_CONTINUATIONS)


def mmlu_gold(doc) -> int:
    return int(doc["answer"])


# --- Winogrande (partial evaluation: one context per option) -----------------


def winogrande_gold(doc) -> int:
    return int(doc["answer"]) - 1


def winogrande_contexts(doc) -> list[str]:
    return [fmt.winogrande_split(doc["sentence"], doc[k])[0] for k in ("option1", "option2")]


def winogrande_continuation(doc) -> str:
    return fmt.winogrande_split(doc["sentence"], doc["option1"])[1]


# --- BoolQ ------------------------------------------------------------------


def boolq_text(doc) -> str:
    return fmt.boolq_context(doc)


def boolq_choices(doc) -> list[str]:
    return list(fmt.BOOLQ_CONTINUATIONS)


def boolq_gold(doc) -> int:
    return int(doc["answer"])
