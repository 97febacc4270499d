"""Circuit tools on contribution weights, next to activation patching.

- :func:`head_scores`: each head's share of its layer's output at chosen queries, and its
  contribution and attention on a chosen key.
- :func:`direct_logit_attribution`: each head's and each source token's direct effect on
  a logit difference (frozen final-norm scale; complete).
- :func:`patch_heads`: activation patching of every head's ``hook_z``.
- :func:`compare_with_patching` on the tasks of :mod:`cwlens.circuits.tasks` (IOI,
  induction, capitals): Spearman and top-k overlap with patching.
- :func:`token_flow`: contribution weights composed through the residual stream.

Names are imported lazily (no transformer_lens or pandas at import).
"""

import importlib

_PUBLIC = {
    "HeadScores": "cwlens.circuits.results",
    "Agreement": "cwlens.circuits.results",
    "agreement": "cwlens.circuits.results",
    "head_scores": "cwlens.circuits.heads",
    "DirectLogitAttribution": "cwlens.circuits.direct",
    "direct_logit_attribution": "cwlens.circuits.direct",
    "patch_heads": "cwlens.circuits.patching",
    "CircuitTask": "cwlens.circuits.tasks",
    "build_task": "cwlens.circuits.tasks",
    "Comparison": "cwlens.circuits.compare",
    "compare_with_patching": "cwlens.circuits.compare",
    "TokenFlow": "cwlens.circuits.flow",
    "token_flow": "cwlens.circuits.flow",
    "run_with_cache": "cwlens.circuits.compare",
}
_ALIASES = {"run_with_cache": "circuit_cache"}  # public name -> name in its module

__all__ = sorted(_PUBLIC)


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), _ALIASES.get(name, name))
    raise AttributeError(f"module 'cwlens.circuits' has no attribute {name!r}")


def __dir__():
    return __all__
