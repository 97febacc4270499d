"""Optional full datasets from the Hugging Face hub (``source="hf"``).

The ``datasets`` library is imported lazily, only here. Hub rows already use the
shipped schemas (gsm8k: question/answer; fineweb-edu: text; cais/mmlu: question/
choices/answer/subject; winogrande: sentence/option1/option2/answer; google/boolq:
question/passage/answer), so they are validated with the same ``Schema`` and
numbered by row (1-based) in error messages.
"""

from __future__ import annotations

import itertools
from typing import Any

from .errors import DatasetSourceError
from .registry import HubSource

_OFFLINE_HINT = (
    'Use source="shipped" for the bundled samples, or path="..." to load a local '
    "JSONL file with the same schema."
)


def _import_datasets() -> Any:
    try:
        import datasets  # optional dependency, imported lazily
    except ImportError as exc:
        raise DatasetSourceError(
            'source="hf" needs the Hugging Face `datasets` library, which is not '
            f"installed (pip install datasets). {_OFFLINE_HINT}"
        ) from exc
    return datasets


def fetch_rows(hub: HubSource, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of one hub split as plain dicts; at most ``limit`` (required when streaming)."""
    datasets = _import_datasets()
    if hub.streaming and limit is None:
        raise ValueError(
            f"{hub.label()} is streamed (billions of tokens); pass n=... to take the first n rows"
        )
    try:
        ds = datasets.load_dataset(hub.path, hub.config, split=hub.split, streaming=hub.streaming)
        rows = ds if limit is None else itertools.islice(ds, limit)
        return [dict(row) for row in rows]
    except Exception as exc:  # network, auth, missing config...: all mean "not available"
        raise DatasetSourceError(
            f"could not read {hub.label()} from the Hugging Face hub "
            f"({type(exc).__name__}: {exc}). The hub may be unreachable or offline. "
            f"{_OFFLINE_HINT}"
        ) from exc
