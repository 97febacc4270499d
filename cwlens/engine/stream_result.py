"""What :func:`cwlens.stream_reduce` returns: :class:`StreamResult`, each reducer's result
by name, with the logits, the closure check and the mask of a padded batch.

It explains itself as TransformerLens' ``ActivationCache`` does: ``print(result)`` lists
each name with what it holds and its shape, ``keys()`` / ``in`` / iteration go over the
names, and ``to_dataframe(name)`` gives a tidy table where one fits.
"""

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from cwlens.engine import reducers
from cwlens.errors import CwlensError, InvalidArgumentError


class UnknownReducerError(CwlensError, KeyError):
    """A :class:`StreamResult` holds no reducer of that name."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


def _shape(t: torch.Tensor, axes: str) -> str:
    return "[" + ", ".join(f"{a} {n}" for a, n in zip(axes.split(), t.shape, strict=False)) + "]"


def describe(value: Any) -> str:
    """One line: what a reducer's result is and its shape (for :meth:`StreamResult.__repr__`)."""
    if isinstance(value, reducers.TopKResult):
        heads = "head 1 (heads summed)" if value.summed_heads else "head"
        axes = f"layer batch {heads.split()[0]} query k"
        note = " (heads summed)" if value.summed_heads else ""
        return (f"TopKResult: the {value.indices.shape[-1]} largest {value.ranked_by} of each row"
                f"{note}, .indices/.values {_shape(value.indices, axes)} (-1/NaN: no key)")
    if isinstance(value, reducers.LayerTensor):
        if value.kind == "token_level":
            return (f"LayerTensor: {value.metric}, heads summed, "
                    f".tensor {_shape(value.tensor, 'layer batch query key')}")
        axes = "layer batch key" if value.tensor.ndim == 3 else "layer batch head key"
        return (f"LayerTensor: column sums of {value.metric} (what each key receives), "
                f".tensor {_shape(value.tensor, axes)}")
    if isinstance(value, reducers.KeySetResult):
        first = next(iter(value.weights.values()))
        return (f"KeySetResult: what keys {list(value.keys)} receive, .weights["
                f"{', '.join(map(repr, value.weights))}] {_shape(first, 'layer batch head query')}")
    if isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()):
        first = next(iter(value.values()))
        return (f"dict of {len(value)} full matrices: [(layer, head, metric)] "
                f"{_shape(first, 'batch query key')}")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        tensors = [f.name for f in dataclasses.fields(value)
                   if isinstance(getattr(value, f.name), torch.Tensor)]
        if tensors:
            first = getattr(value, tensors[0])
            return (f"{type(value).__name__}: .{', .'.join(tensors)} "
                    f"{_shape(first, 'layer batch head')}")
    return type(value).__name__


@dataclass
class StreamResult:
    """What :func:`cwlens.stream_reduce` returns: the logits and each reducer's result by name.

    ``print(result)`` lists the names, what each holds and its shape; ``result.keys()``,
    ``name in result`` and ``for name in result`` go over the names; ``result[name]``
    reads one; ``result.to_dataframe(name)`` makes a tidy table of one (pandas).

    Attributes:
        logits: the model's logits (None when run with ``logits=False``).
        results: ``{reducer name: its result}``; ``result[name]`` reads one.
        closure: a ``cwlens.Closure`` with ``closure=True``, else None.
        attention_mask: ``[batch, pos]``, 1 on real tokens: the mask of a padded batch (a
            list of texts of different lengths is padded as
            ``cwlens.engine.batching.pad_batch`` pads it: on the left for decoders, on the
            right for encoders), or the mask passed in; None when nothing was padded.

    Examples:
        >>> import cwlens, torch
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> out = cwlens.stream_reduce(model, "the cat sat", [cwlens.reducers.HeadSummary()])
        >>> list(out.keys()), "heads" in out
        (['heads'], True)
        >>> out.to_dataframe("heads").columns[:3].tolist()
        ['sample', 'layer', 'head']
    """

    logits: torch.Tensor | None  # None when run with logits=False
    results: dict[str, Any] = field(default_factory=dict)
    closure: Any = None  # a cwlens.engine.measures.Closure when asked for (closure=True)
    attention_mask: torch.Tensor | None = None  # the mask of a padded batch, else None

    def __getitem__(self, name: str) -> Any:
        if name not in self.results:
            raise UnknownReducerError(
                f"no reducer named {name!r} in this result; it holds "
                f"{', '.join(map(repr, self.results)) or 'none'} (a reducer's name: its "
                "name= argument, else e.g. 'top8_contribution', 'heads').")
        return self.results[name]

    def keys(self):
        """The reducers' names, in the order they were given."""
        return self.results.keys()

    def items(self):
        """``(name, result)`` pairs."""
        return self.results.items()

    def __contains__(self, name: object) -> bool:
        return name in self.results

    def __iter__(self):
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __repr__(self) -> str:
        head = []
        if self.logits is not None:
            head.append(f"logits {list(self.logits.shape)}")
        if self.attention_mask is not None:
            head.append(f"attention_mask {list(self.attention_mask.shape)} (padded batch)")
        if self.closure is not None:
            head.append(f"closure: worst relative error {self.closure.worst_relative_error:.1e}")
        lines = [f"StreamResult({', '.join(head) or 'no logits'}); {len(self.results)} result(s):"]
        width = max((len(repr(n)) for n in self.results), default=0)
        lines += [f"  {name!r:<{width}}  {describe(value)}" for name, value in self.results.items()]
        return "\n".join(lines)

    def to_dataframe(self, name: str | None = None):
        """A tidy table (pandas) of one reducer's result; ``name`` may be left out when the
        result holds one. Pad positions are left out and positions count from each text's
        first real token (``attention_mask``).

        ``TopK``: ``layer, batch, head, query, rank, key, value`` (valid entries only;
        ``head = -1``: heads summed); ``ColumnSums``: ``layer, batch, head, key, value``;
        ``TokenLevel``: ``layer, batch, query, key, value``; ``HeadSummary``: one row per
        ``(sample, layer, head)``; ``KeySetWeight``: ``layer, batch, head, query`` and a
        column per metric. ``FullMatrices`` has no table (read ``result[name]``).
        """
        if name is None:
            if len(self.results) != 1:
                raise InvalidArgumentError(
                    f"to_dataframe() needs a name: this result holds {len(self.results)} "
                    f"({', '.join(map(repr, self.results))}); e.g. to_dataframe("
                    f"{next(iter(self.results), 'heads')!r}).")
            name = next(iter(self.results))
        value = self[name]

        if isinstance(value, reducers.TopKResult | reducers.LayerTensor):
            return value.to_dataframe(self.attention_mask)
        if callable(getattr(value, "to_dataframe", None)):
            return value.to_dataframe()
        raise InvalidArgumentError(
            f"{name!r} holds {describe(value)}, which has no table: read it as result[{name!r}] "
            "(tables: TopK, ColumnSums, TokenLevel, HeadSummary, KeySetWeight).")
