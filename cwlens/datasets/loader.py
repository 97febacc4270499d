"""``load_dataset``: pick rows from a source, then format them into records.

Sources:
  source="shipped" (default)  the samples in ``cwlens/datasets/data`` (see SOURCES.md)
  path="file.jsonl"           any local JSONL with the dataset's schema (overrides source)
  source="hf"                 the full split from the Hugging Face hub (needs ``datasets``)

Selection: rows keep their source order; ``seed`` (optional) shuffles them with
``random.Random(seed)``; then the first ``n`` are taken. Ids always come from
the row's position in the source (``"<name>-0007"``), so they are stable under
``n`` and ``seed``. MMLU few-shot exemplars come from the dev split: the shipped
``mmlu_dev.jsonl`` (the complete dev split) for shipped/path, the hub dev split for hf.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError
from . import circuit_tasks, tasks
from .chat_prompts import CHAT_DATASETS, Chat, chat_item
from .hub import fetch_rows
from .jsonl import read_rows, validate_rows
from .records import ChoiceItem, TextSample
from .registry import MMLU_DEV, DatasetSpec, get_spec

SOURCES = ("shipped", "hf")
Row = tuple[int, dict[str, Any]]


def load_dataset(
    name: str,
    n: int | None = None,
    *,
    path: str | Path | None = None,
    source: str = "shipped",
    num_fewshot: int = 0,
    seed: int | None = None,
    chat: Chat | None = None,
) -> list[TextSample] | list[ChoiceItem]:
    """Load ``name`` as ``TextSample``s (gsm8k, fineweb_edu, fineweb_edu_substitute_wikipedia)
    or ``ChoiceItem``s (mmlu, winogrande, boolq; the circuit tasks ioi, induction,
    capitals, :mod:`~cwlens.datasets.circuit_tasks`).

    Args:
        name: a name from ``available_datasets()``.
        n: take the first n rows (after the optional seeded shuffle); None = all.
        path: a local JSONL file with the same schema; takes precedence over ``source``.
        source: "shipped" or "hf".
        num_fewshot: MMLU only, 0-5 same-subject dev exemplars (lm-eval first_n).
        seed: shuffle rows with ``random.Random(seed)`` before taking n.
        chat: mmlu and boolq only: build the chat form of each item
            (:mod:`cwlens.datasets.chat_prompts`, zero-shot) with this function from a
            user turn to the full prompt, e.g.
            ``cwlens.wrap(model).chat_prompt``.

    Raises:
        UnknownDatasetError, DatasetFormatError, DatasetSourceError, InvalidArgumentError
        (a ValueError).
    """
    spec = get_spec(name)
    _check_args(spec, n, source, num_fewshot, seed)
    _check_chat(spec, chat, num_fewshot)
    rows = _rows(spec, n, path, source, seed)
    if seed is not None:
        random.Random(seed).shuffle(rows)
    if n is not None:
        if n > len(rows):
            where = path or source
            raise InvalidArgumentError(
                f"n={n} (CLI: --samples) but {name} ({where}) has only {len(rows)} rows: pass "
                f"{len(rows)} or fewer"
                + ('; source="hf" gives the full split (Python, online)'
                   if source == "shipped" and not path and spec.hub is not None else "")
            )
        rows = rows[:n]
    if spec.info.kind == "text":
        return [_text_sample(spec, index, row) for index, row in rows]
    if chat is not None:
        return [chat_item(tasks.make_id(spec.info.name, i), row, spec.info.name, chat)
                for i, row in rows]
    return _choice_items(spec, rows, num_fewshot, path, source)


def _check_args(spec: DatasetSpec, n, source, num_fewshot, seed) -> None:
    if source not in SOURCES:
        raise InvalidArgumentError(f"source must be one of {SOURCES}, got {source!r}")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 0):
        raise InvalidArgumentError(f"n must be a non-negative int or None, got {n!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidArgumentError(f"seed must be an int or None, got {seed!r}")
    if spec.info.name == "mmlu":
        ok = isinstance(num_fewshot, int) and not isinstance(num_fewshot, bool)
        if not (ok and 0 <= num_fewshot <= tasks.MMLU_MAX_FEWSHOT):
            raise InvalidArgumentError(f"mmlu supports num_fewshot 0-5, got {num_fewshot!r}")
    elif num_fewshot != 0:
        raise InvalidArgumentError(f"num_fewshot is only supported for mmlu, not {spec.info.name}")


def _check_chat(spec: DatasetSpec, chat, num_fewshot) -> None:
    if chat is None:
        return
    if spec.info.name not in CHAT_DATASETS:
        raise InvalidArgumentError(
            f"{spec.info.name} has no chat form (chat prompts exist for "
            f"{', '.join(CHAT_DATASETS)}): load it without chat= (CLI: --prompt plain).")
    if not callable(chat):
        raise InvalidArgumentError(f"chat must be a function from a user turn to the prompt "
                                   f"text (e.g. a model's chat template), got {chat!r}")
    if num_fewshot:
        raise InvalidArgumentError(f"chat prompts are zero-shot; got num_fewshot={num_fewshot}: "
                                   "pass num_fewshot=0 or leave out chat=.")


def _rows(spec: DatasetSpec, n, path, source, seed) -> list[tuple[int, dict[str, Any]]]:
    """``(index, row)`` pairs, index 0-based in source order."""
    if path is not None:
        numbered = read_rows(path, spec.schema)
    elif source == "shipped":
        numbered = read_rows(spec.path, spec.schema)
    else:
        if spec.hub is None:
            raise InvalidArgumentError(
                f"{spec.info.name} has no hub source (it is shipped only: a substitute, or "
                "generated by cwlens); "
                'use source="shipped" or path=...'
            )
        if spec.hub.streaming and seed is not None:
            raise InvalidArgumentError(f"seed is not supported for the streamed {spec.hub.label()}")
        numbered = validate_rows(fetch_rows(spec.hub, limit=n), spec.schema, spec.hub.label())
    return [(index, row) for index, (_, row) in enumerate(numbered)]


def _text_sample(spec: DatasetSpec, index: int, row: Mapping[str, Any]) -> TextSample:
    name = spec.info.name
    text = tasks.gsm8k_text(row) if name == "gsm8k" else tasks.document_text(row)
    return TextSample(id=tasks.make_id(name, index), text=text, dataset=name)


def _choice_items(spec: DatasetSpec, rows, num_fewshot, path, source) -> list[ChoiceItem]:
    name = spec.info.name
    if name in circuit_tasks.TASK_NAMES:
        return [circuit_tasks.choice_item(tasks.make_id(name, i), row, name) for i, row in rows]
    if name == "winogrande":
        return [tasks.winogrande_item(tasks.make_id(name, i), row, name) for i, row in rows]
    if name == "boolq":
        return [tasks.boolq_item(tasks.make_id(name, i), row, name) for i, row in rows]
    pool = _mmlu_pool(source if path is None else "shipped") if num_fewshot else {}
    items = []
    for index, row in rows:
        exemplars = pool.get(row["subject"], [])[:num_fewshot]
        if len(exemplars) < num_fewshot:
            raise InvalidArgumentError(
                f"mmlu subject {row['subject']!r} has {len(exemplars)} dev exemplars, "
                f"num_fewshot={num_fewshot} needs {num_fewshot}"
            )
        items.append(tasks.mmlu_item(tasks.make_id(name, index), row, name, exemplars))
    return items


def _mmlu_pool(source: str) -> dict[str, list[Mapping[str, Any]]]:
    if source == "hf":
        dev = validate_rows(fetch_rows(MMLU_DEV.hub), MMLU_DEV.schema, MMLU_DEV.hub.label())
    else:
        dev = read_rows(MMLU_DEV.path, MMLU_DEV.schema)
    return tasks.mmlu_fewshot_pool([row for _, row in dev])
