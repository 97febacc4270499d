"""The run-time type checker that the test suite applies to every function in cwlens.

``pytest`` runs with ``--jaxtyping-packages=cwlens,tests._typecheck.typechecker``
(pyproject.toml): jaxtyping checks the tensor shapes of :mod:`cwlens.core._types` (``batch``,
``head_index``... must agree between arguments and results) and beartype the other
annotations. Models are duck-typed (``TLModel`` is a static Protocol). User-facing option strings (``Kind``, ``Metric``...) and ``Layers`` are
checked as plain ``str`` / ``object`` here, because cwlens validates them itself with an
error that names the valid choices (:class:`~cwlens.errors.UnknownOptionError`,
:class:`~cwlens.errors.LayerOutOfRangeError`), and that is what the tests check; mypy
still sees the ``Literal`` types.

It lives outside cwlens (the package it instruments) and reads cwlens.core._types on first
use, so that instrumenting ``cwlens/__init__`` does not import itself.
"""

import inspect
from typing import Any

from beartype import BeartypeConf, FrozenDict, beartype

_checker: Any = None


def typechecker(fn: Any) -> Any:
    global _checker
    if _checker is None:
        try:
            from cwlens.core._types import (
                Generation,
                Kind,
                Layers,
                Metric,
                Mode,
                RankingMetric,
                Scope,
                TLModel,
            )
        except ImportError:  # the Protocol stubs of cwlens.core._types itself, while it loads
            return fn
        overrides = {Kind: str, Metric: str, RankingMetric: str, Scope: str, Mode: str,
                     Generation: str, Layers: object, TLModel: object}
        # is_pep484_tower: an int is a valid float (PEP 484, as mypy reads it)
        _checker = beartype(conf=BeartypeConf(hint_overrides=FrozenDict(overrides),
                                              is_pep484_tower=True))
    return _checker(fn)


def unchecked(fn: Any) -> Any:
    """``fn`` without this type checker (``inspect.unwrap``), for tests of what a user gets
    (cwlens' own validation, not beartype's); a public function stays an entry
    (``@takes_model``: the model given becomes its handle), which ``unwrap`` would strip too.
    For plain functions: a context manager's chain (``contextmanager`` around the entry) is
    not rebuilt."""
    inner = inspect.unwrap(fn)
    if getattr(fn, "cwlens_entry", False):
        from cwlens.engine.entry import takes_model

        return takes_model(inner)
    return inner
