"""Strict JSON Lines reading with row-schema validation.

A file holds one JSON object per line (UTF-8; a BOM on line 1 is tolerated;
blank lines are skipped but still counted, so line numbers match an editor).
Every object must carry the schema's fields with the right types; extra
fields are ignored. Any problem raises ``DatasetFormatError`` naming the file,
the 1-based line, what was wrong and the expected schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import DatasetFormatError


@dataclass(frozen=True)
class Field:
    """One required field: ``accepts(value)`` decides; ``describe`` is for messages."""

    name: str
    describe: str
    accepts: Callable[[Any], bool]


@dataclass(frozen=True)
class Schema:
    """The required fields of one row kind."""

    fields: tuple[Field, ...]

    def describe(self) -> str:
        inner = ", ".join(f'"{f.name}": {f.describe}' for f in self.fields)
        return "{" + inner + "}"


def is_str(v: Any) -> bool:
    return isinstance(v, str)


def is_bool(v: Any) -> bool:
    return isinstance(v, bool)


def int_in(lo: int, hi: int) -> Callable[[Any], bool]:
    """Accept an int (not a bool) with ``lo <= v <= hi``."""
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def str_list(length: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, list) and len(v) == length and all(isinstance(x, str) for x in v)


def one_of(*values: Any) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, type(values[0])) and v in values


def str_containing(sub: str) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, str) and sub in v


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    text = text if len(text) <= 60 else text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def format_error(source: str, line: int, problem: str, schema: Schema) -> DatasetFormatError:
    """Build the error raised for any malformed row."""
    return DatasetFormatError(
        f"{source}, line {line}: {problem}. Expected one JSON object per line with "
        f"schema {schema.describe()}"
    )


def validate_row(obj: Any, schema: Schema, source: str, line: int) -> dict[str, Any]:
    """Check one decoded row against ``schema``; return it as a dict."""
    if not isinstance(obj, Mapping):
        raise format_error(
            source, line, f"expected a JSON object, got {type(obj).__name__}", schema
        )
    for field in schema.fields:
        if field.name not in obj:
            raise format_error(source, line, f'missing field "{field.name}"', schema)
        value = obj[field.name]
        if not field.accepts(value):
            raise format_error(
                source,
                line,
                f'field "{field.name}" must be {field.describe}, got {_short(value)}',
                schema,
            )
    return dict(obj)


def iter_rows(path: str | Path, schema: Schema) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, row)`` for each non-blank line of a JSONL file."""
    path = Path(path)
    if path.is_dir():
        raise DatasetFormatError(f"{path} is a folder: pass the JSONL file of the dataset "
                                 "(one JSON object per line), e.g. a path ending in .jsonl")
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    source = str(path)
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise format_error(
                    source, line_no, f"not valid UTF-8 ({exc.reason})", schema
                ) from exc
            if not text.strip():
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                problem = f"invalid JSON ({exc.msg} at column {exc.colno})"
                raise format_error(source, line_no, problem, schema) from exc
            yield line_no, validate_row(obj, schema, source, line_no)


def read_rows(path: str | Path, schema: Schema) -> list[tuple[int, dict[str, Any]]]:
    """All rows of a JSONL file (validated), as ``(line_number, row)`` pairs."""
    return list(iter_rows(path, schema))


def validate_rows(
    rows: Iterable[Mapping[str, Any]], schema: Schema, source: str
) -> list[tuple[int, dict[str, Any]]]:
    """Validate in-memory rows (e.g. from the hub); numbering is 1-based row order."""
    return [(i, validate_row(obj, schema, source, i)) for i, obj in enumerate(rows, start=1)]
