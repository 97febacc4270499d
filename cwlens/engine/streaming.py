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
import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch

from cwlens.core import metrics as _metrics
from cwlens.core._types import Kind
from cwlens.core.geometry import AttentionGeometry, check_kind
from cwlens.engine import adapter, block_fused, validation
from cwlens.engine.adapter import Layers
from cwlens.engine.batching import batch_input
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle
from cwlens.engine.models import blockwise
from cwlens.engine.reducers import Reducer
from cwlens.engine.stream_pass import StreamedPass
from cwlens.engine.stream_result import StreamResult as StreamResult  # re-exported
from cwlens.engine.stream_result import UnknownReducerError as UnknownReducerError  # re-exported
from cwlens.errors import EmptyInputError, InvalidArgumentError, UnknownOptionError

DEFAULT_QUERY_BLOCK = 256
#: ``query_block="auto"`` (the default): DEFAULT_QUERY_BLOCK rows up to 8192 keys, then
#: fewer, so that a block holds at most ``256 * 8192`` entries a head (a [head, rows, n]
#: float32 block of SmolLM2's 9 heads stays ~75 MB), never under MIN_AUTO_QUERY_BLOCK rows
BLOCK_ENTRIES_PER_HEAD = 256 * 8192
MIN_AUTO_QUERY_BLOCK = 32
#: On the CPU a float32 ``[batch, head, rows, n]`` block also stays within CPU_BLOCK_BYTES
#: (glibc's largest mmap threshold, 32 MiB on 64-bit), never under MIN_CPU_QUERY_BLOCK
#: rows: glibc gives a larger block its own mapping, returns it to the kernel when it is
#: freed, and the next block then page-faults every page in afresh (SmolLM2's streamed
#: pass at 8192 tokens: 134.8 s of system time with 256-row blocks, 8.1 s with 113 rows;
#: docs/benchmarks.md). A smaller one is reused from the heap. CUDA's caching allocator
#: reuses blocks of any size.
CPU_BLOCK_BYTES = 32 * 2**20
MIN_CPU_QUERY_BLOCK = 16


def auto_query_block(n_keys: int, rows_of: int | None = None, device: Any = None) -> int:
    """The rows per block of ``query_block="auto"`` for rows of ``n_keys`` keys;
    ``rows_of``: the rows one query row stands for in a block (batch x heads), which on
    the CPU (``device`` None or a CPU) caps the block at ``CPU_BLOCK_BYTES``."""
    rows = min(DEFAULT_QUERY_BLOCK, max(MIN_AUTO_QUERY_BLOCK, BLOCK_ENTRIES_PER_HEAD // max(n_keys, 1)))
    if rows_of and (device is None or torch.device(device).type == "cpu"):
        cap = CPU_BLOCK_BYTES // (4 * rows_of * max(n_keys, 1))
        rows = min(rows, max(MIN_CPU_QUERY_BLOCK, cap))
    return rows


AUTO_THRESHOLD = blockwise.AUTO_THRESHOLD  # attention="auto": blockwise above this


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


ATTENTION_MODES = ("auto", "eager", "blockwise")


def use_blockwise(handle: ModelHandle, input, attention: str) -> bool:
    """Whether a forward on ``input`` runs blockwise under ``attention`` (see
    :data:`ATTENTION_MODES`; ``"auto"``: above :data:`AUTO_THRESHOLD` tokens, where the
    model supports it)."""
    return blockwise_wanted(attention, handle.supports_blockwise, lambda: handle.n_tokens(input))


def blockwise_wanted(attention: str, supported: bool, n_tokens: Callable[[], int]) -> bool:
    """:func:`use_blockwise` on the facts it needs: whether the model ``supported`` blockwise
    attention and (asked only under ``"auto"`` on such a model) the input's length."""
    if attention not in ATTENTION_MODES:
        raise UnknownOptionError(
            f"Unknown attention={attention!r}. Valid: 'auto' (blockwise above "
            f"{AUTO_THRESHOLD} tokens), 'eager' (the model's own attention, whole "
            "[batch, head, n, n] patterns) or 'blockwise' (query blocks, no n x n tensor; "
            "see docs/long_context.md)."
        )
    if attention != "auto":
        return attention == "blockwise"
    return supported and n_tokens() > AUTO_THRESHOLD


def attention_context(handle: ModelHandle, input, attention: str, query_block: int | str | None = "auto"):
    """The context a forward on ``input`` runs in: blockwise attention (in blocks of
    ``query_block`` rows; ``"auto"`` or None: :func:`auto_query_block`) or nothing."""
    n_tokens = functools.cache(lambda: handle.n_tokens(input))  # texts tokenized once
    if not blockwise_wanted(attention, handle.supports_blockwise, n_tokens):
        return contextlib.nullcontext()
    if query_block is None or isinstance(query_block, str):  # "auto" (checked by callers)
        batch = len(input) if isinstance(input, list) else (
            int(input.shape[0]) if isinstance(input, torch.Tensor) and input.ndim > 1 else 1)
        n = n_tokens()
        # layers whose probabilities nobody reads run SDPA, which holds no block of
        # ours: no CPU byte cap there (fewer, larger calls: 1.04-1.23 x less CPU time at
        # 16384 keys, scripts/benchmark.py --sdpa-blocks)
        return blockwise.blockwise_attention(
            handle, auto_query_block(n, batch * handle.n_heads, handle.device),
            auto_query_block(n))
    return blockwise.blockwise_attention(handle, query_block)


def _tokens(handle: ModelHandle, input, attention_mask=None) -> tuple[Any, torch.Tensor | None]:
    """``(input, attention_mask)``: ``input`` checked (:func:`cwlens.engine.validation.model_input`:
    empty, malformed, out of the vocabulary, longer than a learned-position context; texts
    past a rotary context are tokenized whole, with a warning), a list of texts of
    different lengths padded with its mask (:func:`cwlens.engine.batching.batch_input`);
    1-d token ids get a batch axis."""
    input, attention_mask = batch_input(handle, input, attention_mask)
    if isinstance(input, torch.Tensor) and input.ndim == 1:
        return input[None], attention_mask
    return input, attention_mask


def _check_fn(fn: object) -> None:
    if not callable(fn):
        raise InvalidArgumentError(
            f"fn must be a function fn(layer, ...) called once per layer; got {type(fn).__name__} "
            f"{fn!r}.")


@takes_model
def stream_geometry(
    model: ModelLike,
    input,
    fn: Callable[[int, AttentionGeometry], Any],
    layers: Layers = None,
    attention_mask: torch.Tensor | None = None,
    closure: bool = False,
    **options,
) -> tuple[Any, ...]:
    """Run the model once; call ``fn(layer, geometry)`` as each layer is computed.

    ``geometry`` is that layer's :class:`~cwlens.core.AttentionGeometry` (pad queries and
    keys masked by ``attention_mask``; a list of texts of different lengths is padded as
    ``cwlens.engine.batching.pad_batch`` pads it, and ``geometry.position_mask`` is its
    mask: docs/inputs.md). It must not be kept after ``fn`` returns (it
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
    ``"auto"``, :func:`auto_query_block`: 256 up to 8192 tokens, fewer above; on the CPU
    at most 32 MiB a float32 block).

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
    resolved, _ = adapter.resolve_requested_layers(model.n_layers, layers)  # refused before tokenizing
    input, attention_mask = _tokens(model, input, attention_mask)
    return geometry_pass(StreamedPass(model, resolved, attention_mask, closure), input, fn, **run)


def geometry_pass(engine: StreamedPass, tokens: torch.Tensor, fn: Callable[[int, AttentionGeometry], Any],
                  **run) -> tuple:
    """:func:`stream_geometry` on input its caller has checked: ``engine`` the pass (its
    layers resolved, its mask and closure flag), ``tokens`` ``[batch, pos]`` (from
    :func:`_tokens` or a padded batch of a study's own tokenized units), ``run`` the checked
    options (``attention``, ``query_block``, ``logits``, the forward's keywords). Nothing is
    checked again."""
    run = {**PASS_OPTIONS, **run}
    context = attention_context(engine.handle, tokens, run.pop("attention"), run.pop("query_block"))
    return engine.run(tokens, fn, None, context, run.pop("logits"), run)


def _check_flags(closure: object, logits: object, query_block: object) -> None:
    validation.flag(closure, "closure")
    validation.flag(logits, "logits")
    auto = isinstance(query_block, str) and query_block == "auto"
    if query_block is not None and not auto and (
            isinstance(query_block, bool) or not isinstance(query_block, int) or query_block < 1):
        raise InvalidArgumentError(
            f"query_block must be a positive int, 'auto' or None; got {query_block!r}.")


@takes_model
def stream(
    model: ModelLike,
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
    keep from ``weights`` what you need (the tensor itself may be reused).

    A list of texts of different lengths runs as one padded batch, the one
    ``tokens, mask = cwlens.engine.batching.pad_batch(model, texts)`` makes (left-padded
    for decoders, right-padded for encoders): ``weights`` is that batch's
    ``[batch, head, pos, pos]``, each text's real rows and keys equal to its single run and
    the pad rows and columns exactly 0 (``mask`` says which are real; docs/inputs.md).
    ``attention``,
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
    baseline by the value-weighted one, which orders every row the same way); ``causal``
    (a decoder: keys after the query are masked) and ``window`` (the layer's sliding
    window, or None) say which keys a query attends to (:func:`cwlens.engine.row_topk.allowed_keys`).
    """

    def __init__(self, geometry: AttentionGeometry, kind: Kind, n_keys: int, causal: bool = False,
                 window: int | None = None):
        super().__init__()
        self.geometry, self.kind, self.n_keys = geometry, kind, n_keys
        self.causal, self.window = causal, window
        self.derived: dict[tuple, Any] = {}  # what reducers derive from a measure, shared

    def __missing__(self, metric: str) -> torch.Tensor:
        self[metric] = value = _metrics.from_geometry(self.geometry, check_metric(metric), self.kind)
        return value


def _offer_value_product(block: AttentionGeometry, rows: torch.Tensor) -> None:
    """Where the block's geometry computed ``alpha v`` (the contribution and its output
    norms need it) from the very rows the model handed over (same dtype, no padding mask
    applied), the model's attention takes that product instead of computing it again
    (:func:`cwlens.engine.models.blockwise.offer_output`)."""
    z = block.__dict__.get("z_heads")
    if z is not None and block.position_mask is None and block.pattern.dtype == rows.dtype:
        blockwise.offer_output(rows, z)


@takes_model
def stream_reduce(
    model: ModelLike,
    input,
    reducers: dict[str, Any] | Iterable[Any],
    kind: Kind = "inter",
    layers: Layers = None,
    attention_mask: torch.Tensor | None = None,
    query_block: int | str | None = "auto",
    closure: bool = False,
    **options,
) -> StreamResult:
    """Several metrics into several reducers, in one forward pass, in query blocks.

    ``reducers``: ``{name: reducer}`` (or a list, named by their ``name``), each from
    :mod:`cwlens.reducers`. For each layer and each block of ``query_block`` queries, every
    metric some reducer needs is computed once and handed to all reducers that need it.
    ``query_block=None`` computes each layer in one block. ``closure=True`` also checks
    each layer's heads x keys rebuild (``result.closure``, see :func:`stream_geometry`).
    A list of texts of different lengths is padded (``cwlens.engine.batching.pad_batch``)
    and every reducer leaves the pad positions out, as queries and as keys:
    ``result.attention_mask`` is the batch's mask (docs/inputs.md).

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
        query_block: queries per block (``"auto"``: :func:`auto_query_block`, 256 up to
            8192 keys, fewer above, on the CPU at most 32 MiB a float32 block; ``None``:
            each layer in one block).
        closure: also check each layer's heads x keys rebuild.
        **options: ``attention`` (``"auto"``, ``"eager"`` or ``"blockwise"``, see above)
            and ``logits`` (False stops the forward pass after the last streamed layer).

    Returns:
        A ``StreamResult``: ``.logits``, ``[name]`` per reducer (``keys()``, ``in``,
        ``to_dataframe(name)``), ``.closure``, ``.attention_mask``.

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
    resolved, _ = adapter.resolve_requested_layers(model.n_layers, layers)
    info = model.info
    for name, r in named.items():
        r.check(info.n_layers, info.n_heads, resolved, name)
    input, attention_mask = _tokens(model, input, attention_mask)

    for r in named.values():
        r.reset()

    causal = not model.is_encoder
    windows = {ly: model.attention_window(ly) for ly in resolved}
    plan = block_fused.plan_of(named.values())  # what one C call per block can answer
    panels: dict[int, block_fused.LayerPanels] = {}

    def per_layer(layer: int, geo: AttentionGeometry) -> None:
        for r in named.values():
            r.start_layer(layer, geo)
        layer_panels = block_fused.LayerPanels()
        n_q, n_k = geo.pattern.shape[2], geo.pattern.shape[3]
        step = n_q if query_block is None else (
            auto_query_block(n_k, geo.pattern.shape[0] * geo.pattern.shape[1], geo.pattern.device)
            if isinstance(query_block, str) else query_block)
        # widest (last) block first: each later block then fits in memory a freed one
        # leaves, instead of growing the heap (a causal block's width grows with its start)
        for start in reversed(range(0, n_q, step)):
            stop = min(n_q, start + step)
            # causal: keys after the block's last query have a = 0 in every row of it
            key_stop = geo.query_start + stop if causal else n_k
            block = geo if (step >= n_q and key_stop >= n_k) else geo.rows(start, stop, key_stop)
            weights = BlockMeasures(block, kind, n_k, causal, windows[layer])
            block_fused.fill(weights, plan, layer_panels)
            for r in named.values():
                r.update(layer, geo.query_start + start, weights, block)
            del weights, block
        for r in named.values():
            r.end_layer(layer, geo)

    engine = StreamedPass(model, resolved, attention_mask, closure)
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
        weights = BlockMeasures(block, kind, info.n_keys, causal, windows[layer])
        block_fused.fill(weights, plan, panels.setdefault(layer, block_fused.LayerPanels()))
        for r in named.values():
            r.update(layer, info.query_start, weights, block)
        if closure:
            if layer not in rebuilt:  # (not setdefault: it would zero a whole layer per block)
                rebuilt[layer] = v.new_zeros(v.shape[0], info.n_queries, base.W_O.shape[-1],
                                             dtype=block.layer_output.dtype)
            rebuilt[layer][:, info.query_start : info.query_start + info.n_rows] = block.layer_output
        _offer_value_product(block, rows)
        del weights, block
        if info.last:
            for r in named.values():
                r.end_layer(layer, base)
            del bases[layer]
            panels.pop(layer, None)
            if closure:
                engine.rebuilt_output(layer, rebuilt.pop(layer))

    out = engine.run(input, per_layer, per_block,
                     attention_context(model, input, attention, query_block), logits, {})
    results = {}
    for name, r in named.items():
        results[name] = r.result()
        release = getattr(r, "release", None)  # (a reducer not derived from Reducer may lack it)
        if release is not None:
            release()  # before the next result is built (TopK: ~0.3 GB a reducer at 16k tokens)
    return StreamResult(out[0], results, out[2] if closure else None, attention_mask)
