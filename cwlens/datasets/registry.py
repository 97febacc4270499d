"""The datasets cwlens knows: kind, shipped sample file, row count, sha256, source.

The sha256 values here are those recorded in ``data/SOURCES.md``; the test suite
checks both the shipped bytes and that SOURCES.md lists the same values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import UnknownDatasetError
from .jsonl import Schema
from .tasks import BOOLQ_SCHEMA, GSM8K_SCHEMA, MMLU_SCHEMA, TEXT_SCHEMA, WINOGRANDE_SCHEMA

DATA_DIR = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class HubSource:
    """Where ``source="hf"`` reads from (Hugging Face ``datasets.load_dataset`` args)."""

    path: str
    config: str | None
    split: str
    streaming: bool = False

    def label(self) -> str:
        config = f"{self.config}, " if self.config else ""
        return f"hf://{self.path} ({config}{self.split})"


@dataclass(frozen=True)
class DatasetInfo:
    """Public description of one dataset (see ``available_datasets()``)."""

    name: str
    kind: str  # "text" -> TextSample, "choice" -> ChoiceItem
    rows: int  # rows in the shipped sample
    description: str
    license: str


@dataclass(frozen=True)
class DatasetSpec:
    info: DatasetInfo
    filename: str
    sha256: str
    schema: Schema
    hub: HubSource | None

    @property
    def path(self) -> Path:
        return DATA_DIR / self.filename


def _spec(name, kind, rows, sha256, schema, hub, description, license_):
    info = DatasetInfo(name, kind, rows, description, license_)
    return DatasetSpec(info, f"{name}.jsonl", sha256, schema, hub)


SPECS: dict[str, DatasetSpec] = {
    s.info.name: s
    for s in (
        _spec(
            "gsm8k",
            "text",
            500,
            "5cd109055770161910300ddde2ac1bb2e052dea491e321f56d08f2714eacaf3e",
            GSM8K_SCHEMA,
            HubSource("openai/gsm8k", "main", "test"),
            "GSM8K test, first 500 problems",
            "MIT",
        ),
        _spec(
            "fineweb_edu",
            "text",
            150,
            "a8130ba3d67c92ecb46865f133391505fb410d6ac379f4e3c4974794197bae48",
            TEXT_SCHEMA,
            HubSource("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", streaming=True),
            "FineWeb-Edu sample-10BT, 150 documents from the stream head",
            "ODC-By 1.0",
        ),
        _spec(
            "fineweb_edu_substitute_wikipedia",
            "text",
            350,
            "96a8e78252949ac983de16ac637ee27ea7b274f979746502512d39b74202654c",
            TEXT_SCHEMA,
            None,
            "SUBSTITUTE, not FineWeb-Edu: 350 Wikipedia paragraphs from BoolQ dev",
            "CC BY-SA 3.0",
        ),
        _spec(
            "mmlu",
            "choice",
            500,
            "5e889ffe52ff4a4b250c54a5c1c6cbcd35143b55c24bbc96dd269b0483dafadd",
            MMLU_SCHEMA,
            HubSource("cais/mmlu", "all", "test"),
            "MMLU test, round-robin over 57 subjects (8-9 each)",
            "MIT",
        ),
        _spec(
            "winogrande",
            "choice",
            500,
            "dbc222923a807756f10edecf00acf4fa3bd6db167167068b239fd4f6a2d2a41d",
            WINOGRANDE_SCHEMA,
            HubSource("allenai/winogrande", "winogrande_xl", "validation"),
            "Winogrande 1.1 dev (= winogrande_xl validation), first 500",
            "CC-BY",
        ),
        _spec(
            "boolq",
            "choice",
            500,
            "014247c7abcdc7e8e6b426fd909025430d198d4ab72687c26a3793dd04cdf98c",
            BOOLQ_SCHEMA,
            HubSource("google/boolq", None, "validation"),
            "BoolQ dev, first 500",
            "CC BY-SA 3.0",
        ),
    )
}

# Few-shot exemplars for MMLU: the complete dev split (5 per subject), not a dataset of its own.
MMLU_DEV = _spec(
    "mmlu_dev",
    "choice",
    285,
    "635e86504fa7619d9752616fcd001b3eec9e388f7ef718fbc4b64945ed0d484c",
    MMLU_SCHEMA,
    HubSource("cais/mmlu", "all", "dev"),
    "MMLU dev split (few-shot exemplars)",
    "MIT",
)

DATASET_NAMES: tuple[str, ...] = tuple(SPECS)

# Every file shipped in data/, with its sha256 (for integrity checks).
SHIPPED_FILES: dict[str, str] = {spec.filename: spec.sha256 for spec in (*SPECS.values(), MMLU_DEV)}


def get_spec(name: str) -> DatasetSpec:
    try:
        return SPECS[name]
    except (KeyError, TypeError):
        valid = ", ".join(DATASET_NAMES)
        raise UnknownDatasetError(f"unknown dataset {name!r}; valid names: {valid}") from None


def available_datasets() -> tuple[DatasetInfo, ...]:
    """Every loadable dataset with its kind ("text"/"choice") and shipped row count."""
    return tuple(spec.info for spec in SPECS.values())
