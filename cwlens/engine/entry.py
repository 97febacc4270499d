"""Where a public function meets the user's model: :func:`takes_model`.

Every public function that takes a model (``cwlens.*``, each study's entry points) is
marked ``@takes_model``. A user passes their TransformerLens model (or its handle); the
decorator turns it into the model's :class:`~cwlens.engine.handle.ModelHandle`
(:func:`~cwlens.engine.handle.wrap`: checked and made once per model, then cached on it)
before the body runs, so the body and everything it calls take the handle and trust it
(issue 49: the one place in the source that fetches a handle for a caller's model).

    @takes_model
    def decompose(cache, model: ModelLike, layer=None, ...):
        ...  # model is the handle here, whatever the caller passed

The ``model`` parameter is annotated :data:`ModelLike`: what a caller may pass (the docs,
``help()`` and a caller's type checker read it so), and, for mypy inside the body, the
handle's interface.
"""

import functools
import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from cwlens.engine.handle import ModelHandle, wrap

#: What a public function takes: the user's TransformerLens model (``HookedTransformer``,
#: ``HookedEncoder``, ``TransformerBridge``), or its handle. Spelled ``ModelHandle | Any``
#: for mypy: a caller may pass any model, and inside a ``@takes_model`` body, where the
#: argument is the handle, every use is checked against :class:`ModelHandle`.
ModelLike = ModelHandle | Any

P = ParamSpec("P")
R = TypeVar("R")


def takes_model(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` with its ``model`` argument (a TransformerLens model or its handle, given by
    position or by name) replaced by the model's handle before the body runs. A
    non-model is refused by :func:`~cwlens.engine.handle.wrap` with an error that names
    what was passed (a cache, a tokenizer, a configuration, a model name)."""
    position = list(inspect.signature(fn).parameters).index("model")  # ValueError: no model to take

    @functools.wraps(fn)
    def entry(*args, **kwargs):
        if len(args) > position:
            args = (*args[:position], wrap(args[position]), *args[position + 1:])
        elif "model" in kwargs:
            kwargs["model"] = wrap(kwargs["model"])
        return fn(*args, **kwargs)

    entry.cwlens_entry = True  # type: ignore[attr-defined]  # (tests/_typecheck.py: unchecked)
    return entry
