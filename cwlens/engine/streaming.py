"""The streaming engine: every measure computed layer by layer *inside* the forward pass.

``run_with_cache`` keeps every layer's ``[batch, head, query, key]`` pattern until the
forward pass ends, so memory grows with ``layers x n^2``. Here two hooks per layer catch
``hook_v`` and ``hook_pattern`` as the model computes them; as soon as both are there
the layer's :class:`~cwlens.core.AttentionGeometry` is built (once), the requested
measures are computed and handed on, and nothing of size ``[head, n, n]`` outlives the
layer. The hooks only read: the forward pass (and its logits) is unchanged.

Three levels, from the most general to the most convenient:

``stream_geometry(model, input, fn)``
    calls ``fn(layer, geometry)`` for each layer; returns ``(logits, [results])``.
``stream(model, input, fn, metric=..., kind=...)``
    calls ``fn(layer, weights)`` with that layer's ``[batch, head, query, key]`` float32
    tensor of ``metric``; returns ``[fn(...) for each layer]``.
``stream_reduce(model, input, reducers)``
    feeds several metrics to several small :mod:`~cwlens.reducers` (top-k, column sums,
    token-level, head summaries, a few full matrices) in **query blocks** of
    ``query_block`` rows, so the memory beyond the forward pass is a few blocks of
    ``[batch, head, query_block, key]``, whatever ``n`` and the number of layers.

Results equal those from ``run_with_cache`` + :mod:`cwlens.engine.measures` (same math, the same
float32 rounding up to the order of the sums; tested on every tiny architecture).
"""

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from cwlens.core import metrics as _metrics
from cwlens.core._types import Kind
from cwlens.core.geometry import AttentionGeometry, check_kind
from cwlens.engine import adapter, hook_names, validation
from cwlens.engine.adapter import Layers, TLModel
from cwlens.engine.handle import wrap
from cwlens.errors import CwlensError, EmptyInputError, InvalidArgumentError, UnknownOptionError

DEFAULT_QUERY_BLOCK = 256
AUTO_THRESHOLD = adapter.BLOCKWISE_AUTO_THRESHOLD  # attention="auto": blockwise above this

#: The options of one streamed forward pass and their defaults, taken by keyword by
#: :func:`stream_geometry` (all three), :func:`stream` (``attention``, ``query_block``)
#: and :func:`stream_reduce` (``attention``, ``logits``; its ``query_block`` is named).
PASS_OPTIONS: dict[str, Any] = {"attention": "auto", "logits": True, "query_block": None}


def pass_options(where: str, options: dict[str, Any], allowed, forward_rest: bool = False
                 ) -> dict[str, Any]:
    """``options`` with the defaults of :data:`PASS_OPTIONS` filled in for ``allowed``.
    A keyword outside ``allowed`` is refused (:class:`UnknownOptionError`, naming the
    options) unless ``forward_rest``: then it is kept, for the model's forward pass."""
    unknown = [k for k in options if k not in allowed]
    if unknown and not forward_rest:
        raise UnknownOptionError(
            f"{where}() got an unknown option {unknown[0]!r}: its forward-pass options are "
            f"{', '.join(allowed)} (e.g. attention='blockwise')."
        )
    return {**{k: PASS_OPTIONS[k] for k in allowed}, **options}


def check_metric(metric: str) -> str:
    """``metric`` if the streaming engine computes it (:data:`cwlens.core.metrics.GEOMETRY`)."""
    return _metrics.get(metric, _metrics.GEOMETRY).name


class _Taps:
    """Catches ``hook_v`` and ``hook_pattern`` of each layer; calls ``on_layer`` once both
    are in (in whichever order the model fires them), then drops them.

    Under blockwise attention (:mod:`cwlens.engine.models.blockwise`) ``hook_pattern`` fires once
    per query block: each block goes to ``on_block(layer, block, rows, v)`` (``block``
    says where the rows sit), after ``hook_v`` (which fires first, with all keys)."""

    def __init__(self, layers: Sequence[int], on_layer: Callable[..., None],
                 on_block: Callable[..., None] | None = None):
        self.layers = list(layers)
        self.on_layer = on_layer
        self.on_block = on_block
        self.pending: dict[int, dict[str, torch.Tensor]] = {}
        self.residuals: dict[int, torch.Tensor] = {}  # hook_resid_pre: fires before v
        self.done: list[int] = []

    def _catch_residual(self, layer: int):
        def catch(tensor: torch.Tensor, hook) -> None:
            self.residuals[layer] = tensor.detach()
            return None

        catch.__name__ = f"cwlens_stream_resid_pre_{layer}"
        return catch

    def _catch(self, layer: int, what: str):
        def catch(tensor: torch.Tensor, hook) -> None:
            block = adapter.current_block() if what == "pattern" else None
            if block is not None:
                v = self.pending.get(layer, {}).get("v")
                if v is None or self.on_block is None:
                    raise CwlensError(
                        f"Layer {layer}: a blockwise attention block arrived before "
                        f"{hook_names.values(layer)!r}; run with attention='eager'.")
                self.on_block(layer, block, tensor.detach(), v, self.residuals.get(layer))
                if block.query_start + block.n_rows >= block.n_queries:
                    del self.pending[layer]
                    self.residuals.pop(layer, None)
                    self.done.append(layer)
                return None
            slot = self.pending.setdefault(layer, {})
            slot[what] = tensor.detach()
            if len(slot) == 2:
                del self.pending[layer]
                self.on_layer(layer, slot["pattern"], slot["v"], self.residuals.pop(layer, None))
                self.done.append(layer)
            return None  # read only: the forward pass goes on unchanged

        catch.__name__ = f"cwlens_stream_{what}_{layer}"
        catch.cwlens_blockwise = True  # type: ignore[attr-defined]  # takes query blocks
        return catch

    def hooks(self) -> list[tuple[str, Callable]]:
        out = []
        for layer in self.layers:
            out.append((hook_names.values(layer), self._catch(layer, "v")))
            out.append((hook_names.pattern(layer), self._catch(layer, "pattern")))
            out.append((hook_names.resid_pre(layer), self._catch_residual(layer)))
        return out


class _Assembler:
    """Blockwise runs for whole-layer consumers: the blocks of a layer are written into one
    ``[batch, head, query, key]`` tensor, handed to ``on_layer`` once complete, then freed."""

    def __init__(self, on_layer: Callable[..., None]):
        self.on_layer = on_layer
        self.full: dict[int, torch.Tensor] = {}

    def __call__(self, layer: int, block, rows: torch.Tensor, v: torch.Tensor, residual=None) -> None:
        if layer not in self.full:
            b, h = rows.shape[:2]
            self.full[layer] = rows.new_zeros(b, h, block.n_queries, block.n_keys)
        self.full[layer][:, :, block.query_start : block.query_start + block.n_rows, : block.key_stop] = rows
        if block.query_start + block.n_rows >= block.n_queries:
            self.on_layer(layer, self.full.pop(layer), v, residual)


ATTENTION_MODES = ("auto", "eager", "blockwise")


def use_blockwise(model: TLModel, input, attention: str) -> bool:
    """Whether a forward on ``input`` runs blockwise under ``attention`` (see
    :data:`ATTENTION_MODES`; ``"auto"``: above :data:`AUTO_THRESHOLD` tokens, where the
    model supports it)."""
    if attention not in ATTENTION_MODES:
        raise UnknownOptionError(
            f"Unknown attention={attention!r}. Valid: 'auto' (blockwise above "
            f"{AUTO_THRESHOLD} tokens), 'eager' (the model's own attention, whole "
            "[batch, head, n, n] patterns) or 'blockwise' (query blocks, no n x n tensor; "
            "see docs/long_context.md)."
        )
    if attention != "auto":
        return attention == "blockwise"
    if not adapter.supports_blockwise(model):
        return False
    if isinstance(input, torch.Tensor):
        n = input.shape[-1]
    elif isinstance(input, str):
        n = adapter.n_tokens(model, input)
    else:
        n = max((adapter.n_tokens(model, t) for t in input), default=0)
    return n > AUTO_THRESHOLD


def attention_context(model: TLModel, input, attention: str, query_block: int | None = None):
    """The context a forward on ``input`` runs in: blockwise attention or nothing."""
    if use_blockwise(model, input, attention):
        return adapter.blockwise_attention(model, query_block or DEFAULT_QUERY_BLOCK)
    return contextlib.nullcontext()


class _Stop(Exception):
    """Raised after the last needed layer when the logits are not wanted."""


def _tokens(model: TLModel, input, attention_mask=None) -> torch.Tensor | Any:
    """``input`` checked (:func:`cwlens.engine.validation.model_input`: empty, malformed, out of the
    vocabulary, longer than a learned-position context; texts past a rotary context are
    tokenized whole, with a warning); 1-d token ids get a batch axis."""
    input = validation.run_input(model, input, attention_mask)
    if isinstance(input, torch.Tensor) and input.ndim == 1:
        return input[None]
    return input


def _check_fn(fn: object) -> None:
    if not callable(fn):
        raise InvalidArgumentError(
            f"fn must be a function fn(layer, ...) called once per layer; got {type(fn).__name__} "
            f"{fn!r}.")


def stream_geometry(
    model: TLModel,
    input,
    fn: Callable[[int, AttentionGeometry], Any],
    layers: Layers = None,
    attention_mask: torch.Tensor | None = None,
    closure: bool = False,
    **options,
) -> tuple[Any, ...]:
    """Run the model once; call ``fn(layer, geometry)`` as each layer is computed.

    ``geometry`` is that layer's :class:`~cwlens.core.AttentionGeometry` (pad queries and
    keys masked by ``attention_mask``). It must not be kept after ``fn`` returns (it
    holds the layer's pattern): keep what ``fn`` computes from it. Returns
    ``(logits, [fn(...) for each layer, in layer order])``, and with ``closure=True`` a
    third item, the :class:`~cwlens.engine.measures.Closure` check of each layer (the heads x keys
    rebuild against what the heads wrote, caught by one more hook per layer).

    ``attention``: ``"eager"`` (the model's own attention), ``"blockwise"`` (attention in
    query blocks, :mod:`cwlens.engine.models.blockwise`) or ``"auto"`` (blockwise above
    :data:`AUTO_THRESHOLD` tokens). ``fn`` gets a whole layer either way, so a blockwise
    run still holds one layer's ``[batch, head, n, n]`` pattern at a time (but no
    ``n x n`` scores in the forward pass): :func:`stream_reduce` never does.
    ``logits=False`` stops the forward pass after the last layer streamed (the first item
    is then None). ``query_block``: the rows per block of a blockwise run (default
    :data:`DEFAULT_QUERY_BLOCK`).

    Args:
        model: the TransformerLens model.
        input: a text, a list of texts or tokens ``[batch, pos]``.
        fn: called as ``fn(layer, geometry)`` once per layer, during the forward pass.
        layers: an int, a list of ints, or ``None`` for every layer.
        attention_mask: ``[batch, pos]``, 1 on real tokens (pad positions get 0).
        closure: also check each layer's heads x keys rebuild.
        **options: the forward pass's options (:data:`PASS_OPTIONS`), by keyword:
            ``attention`` (``"auto"``, ``"eager"`` or ``"blockwise"``, see above),
            ``logits`` (False stops the forward pass after the last streamed layer) and
            ``query_block`` (rows per block of a blockwise run); any other keyword is
            passed on to the model's forward pass.

    Returns:
        ``(logits, outputs)``, or ``(logits, outputs, closure)`` with ``closure=True``.

    Examples:
        >>> import cwlens, torch
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> def sink_share(layer, geo):  # first token's share of each query's output
        ...     return geo.contribution("inter")[..., 0].sum(1)
        >>> logits, shares, check = cwlens.stream_geometry(model, "the cat sat", sink_share,
        ...                                                closure=True)
        >>> [tuple(s.shape) for s in shares], check.worst_relative_error < 1e-5
        ([(1, 4), (1, 4)], True)
    """
    run = pass_options("stream_geometry", options, PASS_OPTIONS, forward_rest=True)
    _check_fn(fn)
    _check_flags(closure, run["logits"], run["query_block"])
    engine = _Engine(model, layers, attention_mask, closure)
    input = _tokens(model, input, attention_mask)
    _, out = engine.run(input, fn, None, run.pop("attention"), run.pop("query_block"),
                        run.pop("logits"), run)
    return out


def _check_flags(closure: object, logits: object, query_block: object) -> None:
    validation.flag(closure, "closure")
    validation.flag(logits, "logits")
    if query_block is not None and (isinstance(query_block, bool) or not isinstance(query_block, int)
                                    or query_block < 1):
        raise InvalidArgumentError(f"query_block must be a positive int or None; got {query_block!r}.")


class _Engine:
    """One streamed forward pass: taps, the closure check, blockwise or eager attention."""

    def __init__(self, model: TLModel, layers: Layers, attention_mask: torch.Tensor | None,
                 closure: bool):
        self.model = model
        self.layers, _ = adapter.resolve_layers(model, layer=layers)
        self.attention_mask = attention_mask
        self.mask = None if attention_mask is None else attention_mask.bool()
        self.closure = closure
        self.rebuilt: dict[int, torch.Tensor] = {}
        self.targets: dict[int, torch.Tensor] = {}
        self.errors: dict[int, tuple[float, float]] = {}

    def geometry(self, layer: int, pattern: torch.Tensor, v: torch.Tensor,
                 residual: torch.Tensor | None = None) -> AttentionGeometry:
        return adapter.layer_geometry(self.model, layer, pattern, v, self.mask, residual)

    def rebuilt_output(self, layer: int, output: torch.Tensor) -> None:
        """What the heads x keys rebuild for ``layer`` ([batch, pos, d_model]): checked
        against the model's own output of the heads, whichever comes first."""
        from cwlens.engine.measures import closure_errors

        if layer in self.targets:
            self.errors[layer] = closure_errors(output, self.targets.pop(layer), self.attention_mask)
        else:
            self.rebuilt[layer] = output

    def _check(self, layer: int):
        from cwlens.engine.measures import closure_errors

        # the heads' output usually fires after the pattern; where the pattern hook fires
        # after the attention module returns (the bridge's BERT), it comes first
        def check_closure(tensor: torch.Tensor, hook) -> None:
            target = adapter.heads_output_from(self.model, layer, tensor.detach())
            if layer in self.rebuilt:
                self.errors[layer] = closure_errors(self.rebuilt.pop(layer), target, self.attention_mask)
            else:
                self.targets[layer] = target
            return None

        return check_closure

    def run(self, input, fn, on_block, attention: str, query_block: int | None, logits: bool,
            forward_kwargs: dict) -> tuple[bool, tuple[Any, ...]]:
        """Run the forward; ``fn(layer, geometry)`` for whole layers, or ``on_block(layer,
        block, rows, v)`` for blockwise runs where given. Returns ``(blockwise, outputs)``."""
        from cwlens.engine.measures import Closure

        model, resolved = self.model, self.layers  # input: checked by _tokens
        blockwise = use_blockwise(model, input, attention)
        results: dict[int, Any] = {}

        def on_layer(layer: int, pattern: torch.Tensor, v: torch.Tensor, residual=None) -> None:
            geo = self.geometry(layer, pattern, v, residual)
            if self.closure:  # [batch, pos, d_model] tensors: small
                self.rebuilt_output(layer, geo.layer_output)
            results[layer] = fn(layer, geo)

        if on_block is not None:
            def block_then_mark(layer, block, rows, v, residual=None):
                on_block(layer, block, rows, v, residual)
                if block.query_start + block.n_rows >= block.n_queries:
                    results[layer] = None

            taps = _Taps(resolved, on_layer, block_then_mark)
        else:
            taps = _Taps(resolved, on_layer, _Assembler(on_layer))
        # the residual stream is caught for ALTI where the model names it (cheap: a reference)
        hooks = [(name, fn) for name, fn in taps.hooks()
                 if name.endswith(("hook_v", "hook_pattern")) or adapter.has_hook(model, name)]
        if self.closure:
            hooks += [(adapter.closure_hook(model, ly), self._check(ly)) for ly in resolved]
        stop = hook_names.resid_post(max(resolved))
        if not logits and adapter.has_hook(model, stop):
            hooks.append((stop, _raise_stop))
        forward_kwargs = dict(forward_kwargs)
        forward_kwargs.update(adapter.forward_kwargs(model, self.attention_mask))
        context = adapter.blockwise_attention(model, query_block or DEFAULT_QUERY_BLOCK) \
            if blockwise else contextlib.nullcontext()
        out_logits = None
        with torch.no_grad(), context, wrap(model).hooks(hooks):
            try:
                out_logits = model(input, **forward_kwargs)  # type: ignore[operator]
            except _Stop:
                pass
        if not logits:
            out_logits = None
        missing = [ly for ly in resolved if ly not in results]
        if missing:
            raise CwlensError(
                f"Layers {missing} did not fire both {hook_names.values(missing[0])!r} and "
                f"{hook_names.pattern(missing[0])!r} during the forward pass: this model's "
                "attention does not expose its pattern through TransformerLens hooks."
            )
        outputs = [results[ly] for ly in resolved]
        if not self.closure:
            return blockwise, (out_logits, outputs)
        if any(ly not in self.errors for ly in resolved):
            raise CwlensError(
                f"The closure hook {adapter.closure_hook(model, resolved[0])!r} did not fire: "
                "the closure check cannot be made on this model."
            )
        errors = self.errors
        return blockwise, (out_logits, outputs, Closure(
            tuple(resolved), tuple(errors[ly][0] for ly in resolved), tuple(errors[ly][1] for ly in resolved)
        ))


def _raise_stop(tensor: torch.Tensor, hook) -> None:
    raise _Stop


def stream(
    model: TLModel,
    input,
    fn: Callable[[int, torch.Tensor], Any],
    metric: str = "contribution",
    kind: Kind = "inter",
    layers: Layers = None,
    attention_mask: torch.Tensor | None = None,
    **options,
) -> list[Any]:
    """Call ``fn(layer, weights)`` with each layer's ``[batch, head, query, key]`` float32
    tensor of ``metric`` while the model runs; return ``[fn(...) for each layer]``.

    ``metric``: any geometry metric of :mod:`cwlens.core.metrics` (``attention``,
    ``value_weighted``, ``value_weighted_output_normalized``, ``contribution`` (signed),
    ``contribution_abs``, ``alti``); ``kind`` picks ``o`` (``"inter"``:
    the layer's output, ``"intra"``: the head's). Only one layer's weights exist at a time;
    keep from ``weights`` what you need (the tensor itself may be reused). ``attention``,
    ``query_block``: see :func:`stream_geometry`. The forward pass stops after the last layer streamed
    (no unembedding).

    Args:
        model: the TransformerLens model.
        input: a text, a list of texts or tokens ``[batch, pos]``.
        fn: called as ``fn(layer, weights)`` once per layer, during the forward pass.
        metric: the metric's name (see above).
        kind: ``"inter"`` or ``"intra"``: which output ``o`` the metric uses.
        layers: an int, a list of ints, or ``None`` for every layer.
        attention_mask: ``[batch, pos]``, 1 on real tokens (pad positions get 0).
        **options: ``attention`` (``"auto"``, ``"eager"`` or ``"blockwise"``, see
            :func:`stream_geometry`) and ``query_block`` (rows per block of a blockwise run).

    Returns:
        ``[fn(layer, weights) for each layer]``, in layer order.

    Examples:
        >>> import cwlens, torch
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> received = cwlens.stream(model, "the cat sat", lambda layer, w: w.sum((1, 2)))
        >>> len(received), received[0].shape  # per layer: what each key receives
        (2, torch.Size([1, 4]))
        >>> logits, cache = cwlens.run_with_cache(model, "the cat sat")  # the same numbers
        >>> torch.allclose(received[1], cwlens.contribution_weights(cache, model, 1).sum((1, 2)))
        True
    """
    run = pass_options("stream", options, ("attention", "query_block"))
    _check_fn(fn)
    check_metric(metric)
    check_kind(kind)
    _, out = stream_geometry(
        model, input, lambda layer, geo: fn(layer, _metrics.from_geometry(geo, metric, kind)), layers, attention_mask,
        logits=False, **run,
    )
    return out


def _named_reducers(reducers: object) -> dict[str, Any]:
    """``{name: reducer}`` from a dict or a list (named by ``reducer.name``), each a
    :class:`cwlens.reducers.Reducer` and each name once."""
    from cwlens.engine.reducers import Reducer

    if isinstance(reducers, Reducer):
        reducers = [reducers]
    if isinstance(reducers, dict):
        pairs = list(reducers.items())
    elif isinstance(reducers, str | bytes) or not hasattr(reducers, "__iter__"):
        raise InvalidArgumentError(
            f"reducers must be a list or a {{name: reducer}} dict of cwlens.reducers objects; "
            f"got {type(reducers).__name__} {reducers!r}.")
    else:
        pairs = [(getattr(r, "name", None), r) for r in reducers]
    if not pairs:
        raise EmptyInputError("stream_reduce needs at least one reducer (see cwlens.reducers).")
    named: dict[str, Any] = {}
    for name, r in pairs:
        if not isinstance(r, Reducer):
            raise InvalidArgumentError(
                f"{r!r} is not a reducer: pass cwlens.reducers objects (TopK, ColumnSums, "
                "TokenLevel, HeadSummary, FullMatrices) or a subclass of cwlens.reducers.Reducer.")
        validation.label(name, "a reducer's name")
        if name in named:
            raise InvalidArgumentError(
                f"two reducers are named {name!r}: the second would overwrite the first's "
                "result; give one another name (name=...) or pass a dict {name: reducer}.")
        named[name] = r
    return named


class BlockMeasures(dict):
    """``{metric: [batch, head, block, key_width]}`` for one block of queries, each metric
    computed on first access and shared by every reducer that reads it.

    ``key_width`` may be less than ``n_keys`` (a causal block stops at its last query):
    the entries after it are 0 in every measure. ``kind`` and ``geometry`` are there for
    reducers that use them (e.g. :class:`~cwlens.reducers.TopK` ranks the output-normalised
    baseline by the value-weighted one, which orders every row the same way).
    """

    def __init__(self, geometry: AttentionGeometry, kind: Kind, n_keys: int):
        super().__init__()
        self.geometry, self.kind, self.n_keys = geometry, kind, n_keys

    def __missing__(self, metric: str) -> torch.Tensor:
        self[metric] = value = _metrics.from_geometry(self.geometry, check_metric(metric), self.kind)
        return value


@dataclass
class StreamResult:
    """What :func:`stream_reduce` returns: the logits and each reducer's result by name.

    Attributes:
        logits: the model's logits (None when run with ``logits=False``).
        results: ``{reducer name: its result}``; ``result[name]`` reads one.
        closure: a :class:`~cwlens.engine.measures.Closure` with ``closure=True``, else None.

    Examples:
        >>> import cwlens, torch
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> out = cwlens.stream_reduce(model, "the cat sat", [cwlens.reducers.HeadSummary()])
        >>> sorted(out.results)
        ['heads']
    """

    logits: torch.Tensor | None  # None when run with logits=False
    results: dict[str, Any] = field(default_factory=dict)
    closure: Any = None  # a cwlens.engine.measures.Closure when asked for (closure=True)

    def __getitem__(self, name: str) -> Any:
        return self.results[name]


def stream_reduce(
    model: TLModel,
    input,
    reducers: dict[str, Any] | Iterable[Any],
    kind: Kind = "inter",
    layers: Layers = None,
    attention_mask: torch.Tensor | None = None,
    query_block: int | None = DEFAULT_QUERY_BLOCK,
    closure: bool = False,
    **options,
) -> StreamResult:
    """Several metrics into several reducers, in one forward pass, in query blocks.

    ``reducers``: ``{name: reducer}`` (or a list, named by their ``name``), each from
    :mod:`cwlens.reducers`. For each layer and each block of ``query_block`` queries, every
    metric some reducer needs is computed once and handed to all reducers that need it.
    ``query_block=None`` computes each layer in one block. ``closure=True`` also checks
    each layer's heads x keys rebuild (``result.closure``, see :func:`stream_geometry`).

    ``attention="blockwise"`` (or ``"auto"`` above :data:`AUTO_THRESHOLD` tokens) runs the
    model's attention itself in blocks of ``query_block`` queries and hands each block to
    the reducers as it is computed: no ``[batch, head, n, n]`` tensor exists at any point
    (:mod:`cwlens.engine.models.blockwise`). ``logits=False`` stops the forward pass after the
    last layer streamed (``result.logits`` is then None).


    Args:
        model: the TransformerLens model.
        input: a text, a list of texts or tokens ``[batch, pos]``.
        reducers: ``{name: reducer}`` or a list of reducers (named by their ``name``).
        kind: ``"inter"`` or ``"intra"``: which output ``o`` the metrics use.
        layers: an int, a list of ints, or ``None`` for every layer.
        attention_mask: ``[batch, pos]``, 1 on real tokens (pad positions get 0).
        query_block: queries per block (``None``: each layer in one block).
        closure: also check each layer's heads x keys rebuild.
        **options: ``attention`` (``"auto"``, ``"eager"`` or ``"blockwise"``, see above)
            and ``logits`` (False stops the forward pass after the last streamed layer).

    Returns:
        A :class:`StreamResult`: ``.logits``, ``[name]`` per reducer, ``.closure``.

    Raises:
        CwlensError: no reducer, or a ``query_block`` that is not a positive int.

    Examples:
        >>> import cwlens, torch
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> out = cwlens.stream_reduce(model, "the cat sat on the mat", {
        ...     "top": cwlens.reducers.TopK(k=3, metric="contribution"),
        ...     "received": cwlens.reducers.ColumnSums("contribution"),
        ... }, query_block=2)
        >>> out["top"].indices.shape  # [layer, batch, head, query, k]
        torch.Size([2, 1, 4, 7, 3])
    """
    run = pass_options("stream_reduce", options, ("attention", "logits"))
    attention, logits = run["attention"], run["logits"]
    check_kind(kind)
    named = _named_reducers(reducers)
    _check_flags(closure, logits, query_block)
    metrics = list(dict.fromkeys(m for r in named.values() for m in r.metrics))
    for m in metrics:
        check_metric(m)
    resolved, _ = adapter.resolve_layers(model, layer=layers)
    info = adapter.ModelInfo.of(model)
    for name, r in named.items():
        r.check(info.n_layers, info.n_heads, resolved, name)
    input = _tokens(model, input, attention_mask)

    for r in named.values():
        r.reset()

    causal = not adapter.is_encoder(model)

    def per_layer(layer: int, geo: AttentionGeometry) -> None:
        for r in named.values():
            r.start_layer(layer, geo)
        n_q, n_k = geo.pattern.shape[2], geo.pattern.shape[3]
        step = n_q if query_block is None else query_block
        # widest (last) block first: each later block then fits in memory a freed one
        # leaves, instead of growing the heap (a causal block's width grows with its start)
        for start in reversed(range(0, n_q, step)):
            stop = min(n_q, start + step)
            # causal: keys after the block's last query have a = 0 in every row of it
            key_stop = geo.query_start + stop if causal else n_k
            block = geo if (step >= n_q and key_stop >= n_k) else geo.rows(start, stop, key_stop)
            weights = BlockMeasures(block, kind, n_k)
            for r in named.values():
                r.update(layer, geo.query_start + start, weights, block)
            del weights, block
        for r in named.values():
            r.end_layer(layer, geo)

    engine = _Engine(model, layers, attention_mask, closure)
    bases: dict[int, AttentionGeometry] = {}
    rebuilt: dict[int, torch.Tensor] = {}

    def per_block(layer: int, info, rows: torch.Tensor, v: torch.Tensor, residual=None) -> None:
        """Blockwise attention: one block of a layer's rows, straight to the reducers."""
        if layer not in bases:  # the layer's key side (values, norms), before its first rows
            b, h = rows.shape[:2]
            bases[layer] = base = engine.geometry(layer, rows.new_zeros(b, h, 1, info.n_keys), v, residual)
            for r in named.values():
                r.start_layer(layer, base)
        base = bases[layer]
        block = base.with_rows(rows, info.query_start)
        weights = BlockMeasures(block, kind, info.n_keys)
        for r in named.values():
            r.update(layer, info.query_start, weights, block)
        if closure:
            out = rebuilt.setdefault(layer, v.new_zeros(v.shape[0], info.n_queries, base.W_O.shape[-1],
                                                        dtype=block.layer_output.dtype))
            out[:, info.query_start : info.query_start + info.n_rows] = block.layer_output
        del weights, block
        if info.query_start + info.n_rows >= info.n_queries:
            for r in named.values():
                r.end_layer(layer, base)
            del bases[layer]
            if closure:
                engine.rebuilt_output(layer, rebuilt.pop(layer))

    _, out = engine.run(input, per_layer, per_block, attention, query_block, logits, {})
    return StreamResult(out[0], {name: r.result() for name, r in named.items()},
                        out[2] if closure else None)
