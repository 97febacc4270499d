"""Evaluation datasets for cwlens (pure Python; no torch import).

    from cwlens.datasets import load_dataset, available_datasets
    docs  = load_dataset("gsm8k", n=100)            # list[TextSample]
    items = load_dataset("mmlu", num_fewshot=5)     # list[ChoiceItem]

Text datasets: gsm8k, fineweb_edu, fineweb_edu_substitute_wikipedia.
Choice datasets (lm-eval-harness formats): mmlu, winogrande, boolq; and the circuit
tasks ioi, induction, capitals (generated, ``cwlens.datasets.circuit_tasks``), which
small models solve. mmlu and boolq also have a chat form (one user turn of an
instruction-tuned model's chat template, zero-shot): ``load_dataset("mmlu", chat=...)``,
``cwlens.datasets.chat_prompts``.
Formats are documented in ``cwlens.datasets.tasks``; provenance and licences
of the shipped samples in ``cwlens/datasets/data/SOURCES.md``.
"""

from .chat_prompts import CHAT_DATASETS
from .errors import DatasetFormatError, DatasetSourceError, UnknownDatasetError
from .loader import load_dataset
from .records import ChoiceItem, TextSample
from .registry import DATA_DIR, DATASET_NAMES, SHIPPED_FILES, DatasetInfo, available_datasets

__all__ = [
    "CHAT_DATASETS",
    "DATASET_NAMES",
    "DATA_DIR",
    "SHIPPED_FILES",
    "ChoiceItem",
    "DatasetFormatError",
    "DatasetInfo",
    "DatasetSourceError",
    "TextSample",
    "UnknownDatasetError",
    "available_datasets",
    "load_dataset",
]
