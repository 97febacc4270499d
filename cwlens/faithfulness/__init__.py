"""Faithfulness of importance metrics by value masking (comprehensiveness / sufficiency).

    from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
    result = run_faithfulness(model, "gsm8k", FaithfulnessConfig(), n=50, out="runs/f/gsm8k.jsonl")
    result.summary()

Modules: ``ranking`` (rankings -> masks), ``lm`` (NLL/PPL), ``choice`` (lm-eval-style
log-likelihood scoring), ``results`` (tidy JSONL, resume, bootstrap summary),
``sweep`` (the orchestration), ``report`` (markdown tables). Imported lazily.
"""

import importlib

_PUBLIC = {
    "FaithfulnessConfig": "cwlens.faithfulness.sweep",
    "FaithfulnessResult": "cwlens.faithfulness.sweep",
    "run_faithfulness": "cwlens.faithfulness.sweep",
    "Ranking": "cwlens.faithfulness.ranking",
    "rank_entries": "cwlens.faithfulness.ranking",
    "eligible_entries": "cwlens.faithfulness.ranking",
    "RANKINGS": "cwlens.faithfulness.ranking",
    "SCOPES": "cwlens.faithfulness.ranking",
    "MODES": "cwlens.faithfulness.ranking",
    "read_results": "cwlens.faithfulness.results",
    "summarize": "cwlens.faithfulness.results",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'cwlens.faithfulness' has no attribute {name!r}")
