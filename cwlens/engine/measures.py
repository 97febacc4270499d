"""Public entry points: contribution weights, baselines, factors and closure from a cache.

Every function takes ``(cache, model, layer)`` like TransformerLens' own analysis tools:
``layer`` is an int (result ``[batch, head_index, query_pos, key_pos]``), a list of ints
or ``None`` for all layers (result with a leading ``layer`` axis). Results are float32.

``attention_mask`` (``[batch, pos]``, 1 on real tokens) is the mask the batch was run
with; pad positions then get weight 0. Shapes: see :mod:`cwlens.core._types`.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cwlens.core import metrics
from cwlens.core._types import Cache, Kind, LayerPairWeights, LayerTokenWeights
from cwlens.core.geometry import check_kind
from cwlens.core.metrics import get as get_metric
from cwlens.core.numerics import worst
from cwlens.engine import adapter, hook_names, validation
from cwlens.engine.adapter import Layers
from cwlens.engine.batching import batch_input
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle
from cwlens.errors import InvalidArgumentError, NonFiniteError, ShapeMismatchError


def _mask(cache, attention_mask):
    """``attention_mask`` checked, or (None) the mask remembered with the cache
    (:func:`run_with_cache` of a list of texts): pad positions are never counted."""
    if attention_mask is not None:
        validation.mask_values(attention_mask)
        return attention_mask
    return adapter.cache_mask(cache)


def _per_layer(cache, handle: ModelHandle, layer, attention_mask, fn: Callable,
               what: str = "this call", residual: bool = False) -> torch.Tensor:
    layers, single = adapter.resolve_requested_layers(handle.n_layers, layer)
    adapter.require_cached(cache, handle, layers, residual=residual, what=what)
    attention_mask = _mask(cache, attention_mask)
    outs = [fn(adapter.geometry(cache, handle, ly, attention_mask)) for ly in layers]
    return outs[0] if single else torch.stack(outs)


@takes_model
def contribution_weights(
    cache: Cache,
    model: ModelLike,
    layer: Layers = None,
    kind: Kind = "inter",
    attention_mask: torch.Tensor | None = None,
) -> LayerPairWeights:
    """Signed contribution weights ``c_ij^h = <o_i, a_ij^h v~_j^h> / ||o_i||^2``.

    ``kind="inter"``: ``o_i`` is the layer's multi-head output (b_O excluded); the weights
    sum to 1 over heads and keys *together*: one head's row sums to that head's share of
    the layer output (about -0.06..0.33 on SmolLM2), not to 1. ``kind="intra"``: ``o_i`` is
    head ``h``'s own output; each head's row sums to 1 over keys, as attention does. So
    "a head's contribution" means two things: to compare one head's contribution with its
    attention (a per-head view, CircuitsVis), take ``kind="intra"``; to say how much of the
    layer's output a head and key carry, ``"inter"``.

    Args:
        cache: the cache of :func:`run_with_cache` (or any cache holding ``hook_pattern``
            and ``hook_v`` of the layers asked for).
        model: the TransformerLens model the cache comes from.
        layer: an int, a list of ints, or ``None`` for every layer.
        kind: ``"inter"`` (the layer's output) or ``"intra"`` (the head's own output).
        attention_mask: ``[batch, pos]``, 1 on real tokens: the mask the batch was run
            with (pad queries and keys get 0).

    Returns:
        ``[batch, head_index, query_pos, key_pos]`` float32 weights for one layer;
        ``[layer, batch, head_index, query_pos, key_pos]`` for a list or ``None``.

    Raises:
        LayerOutOfRangeError: a layer the model does not have.
        UnknownOptionError: a ``kind`` other than ``"inter"`` or ``"intra"``.

    Examples:
        >>> import cwlens, torch
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> logits, cache = cwlens.run_with_cache(model, "the cat sat on the mat")
        >>> c = cwlens.contribution_weights(cache, model, layer=0)
        >>> c.shape  # [batch, head, query, key]
        torch.Size([1, 4, 7, 7])
        >>> torch.allclose(c.sum((1, 3)), torch.ones(1, 7), atol=1e-5)  # heads x keys sum to 1
        True
        >>> intra = cwlens.contribution_weights(cache, model, layer=0, kind="intra")
        >>> torch.allclose(intra.sum(3), torch.ones(1, 4, 7), atol=1e-4)  # each head's row
        True
        >>> cwlens.contribution_weights(cache, model).shape  # every layer
        torch.Size([2, 1, 4, 7, 7])
    """
    check_kind(kind)
    return _per_layer(cache, model, layer, attention_mask, lambda g: g.contribution(kind),
                      what="contribution_weights")


@takes_model
def token_contributions(
    cache: Cache,
    model: ModelLike,
    layer: Layers = None,
    attention_mask: torch.Tensor | None = None,
) -> LayerTokenWeights:
    """Token-level weights ``c_ij = sum_h c_ij^h`` (inter-head weights summed over heads).

    Args:
        cache: the cache of :func:`run_with_cache`.
        model: the TransformerLens model the cache comes from.
        layer: an int, a list of ints, or ``None`` for every layer.
        attention_mask: ``[batch, pos]``, 1 on real tokens (pad positions get 0).

    Returns:
        ``[batch, query_pos, key_pos]`` float32 (``[layer, ...]`` for several layers);
        each row sums to 1.

    Examples:
        >>> import cwlens, torch
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> logits, cache = cwlens.run_with_cache(model, "the cat sat on the mat")
        >>> tok = cwlens.token_contributions(cache, model, layer=1)
        >>> tok.shape  # [batch, query, key]
        torch.Size([1, 7, 7])
        >>> torch.allclose(tok.sum(-1), torch.ones(1, 7), atol=1e-5)
        True
    """
    return contribution_weights(cache, model, layer, "inter", attention_mask).sum(-3)


@takes_model
def importance(
    cache: Cache,
    model: ModelLike,
    layer: Layers = None,
    metric: str = "contribution",
    kind: Kind = "inter",
    attention_mask: torch.Tensor | None = None,
) -> LayerPairWeights:
    """One importance measure by name, per head: ``[batch, head_index, query_pos, key_pos]``.

    ``metric``: ``"attention"`` (a), ``"value_weighted"`` (a ||v~||, Kobayashi et al. 2020),
    ``"value_weighted_output_normalized"`` (a ||v~|| / ||o||) or ``"contribution"``
    (a ||v~|| / ||o|| cos(o, v~)), or any other geometry metric of :mod:`cwlens.core.metrics`
    (``"contribution_abs"``, ``"alti"``). ``kind`` picks ``o`` where the metric uses one.

    Args:
        cache: the cache of :func:`run_with_cache`.
        model: the TransformerLens model the cache comes from.
        layer: an int, a list of ints, or ``None`` for every layer.
        metric: the metric's name (see above).
        kind: ``"inter"`` or ``"intra"``: which output ``o`` the metric normalises by.
        attention_mask: ``[batch, pos]``, 1 on real tokens (pad positions get 0).

    Returns:
        ``[batch, head_index, query_pos, key_pos]`` float32 (``[layer, ...]`` for several
        layers).

    Raises:
        UnknownOptionError: a metric name cwlens does not know (the message lists them).

    Examples:
        >>> import cwlens, torch
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> logits, cache = cwlens.run_with_cache(model, "the cat sat on the mat")
        >>> att = cwlens.importance(cache, model, 0, metric="attention")
        >>> torch.allclose(att.sum(-1), torch.ones(1, 4, 7))  # each head's row sums to 1
        True
        >>> vw = cwlens.importance(cache, model, 0, metric="value_weighted")
        >>> bool((vw >= 0).all())  # a ||v~||: never negative, unlike the contribution
        True
    """
    get_metric(metric, metrics.GEOMETRY)
    check_kind(kind)
    return _per_layer(cache, model, layer, attention_mask,
                      lambda g: metrics.from_geometry(g, metric, kind),
                      what=f"importance(metric={metric!r})", residual=metric == "alti")


@dataclass(frozen=True)
class Decomposition:
    """``contribution = attention * relative_norm * cosine``, each ``[(layer,) batch, head, query, key]``.

    ``relative_norm`` is ``||v~_j|| / ||o_i||`` and ``cosine`` is ``cos(o_i, v~_j)``, with
    ``o`` chosen by ``kind``. ``max_product_error`` is how far the product of the factors
    is from the weight (float rounding only).

    Attributes:
        attention: the attention weights ``a_ij``.
        relative_norm: ``||v~_j|| / ||o_i||``.
        cosine: ``cos(o_i, v~_j)``.
        contribution: the contribution weights ``c_ij``.
        kind: ``"inter"`` or ``"intra"``: the output ``o`` of the split.
        layers: the layers, in the order of the leading axis (one layer: no axis).
        causal: whether the model is a decoder (keys ``j <= i`` only); ``to_dataframe``
            lists the keys a query sees.
        attention_mask: the ``[batch, pos]`` mask of a padded batch (None: no padding);
            ``to_dataframe`` leaves its pad keys out.

    Examples:
        >>> import cwlens, torch
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> logits, cache = cwlens.run_with_cache(model, "the cat sat on the mat")
        >>> parts = cwlens.decompose(cache, model, 1)
        >>> parts.max_product_error < 1e-5
        True
        >>> parts.to_dataframe(query=-1).columns.tolist()
        ['layer', 'head', 'query', 'key', 'attention', 'relative_norm', 'cosine', 'contribution']
    """

    attention: torch.Tensor
    relative_norm: torch.Tensor
    cosine: torch.Tensor
    contribution: torch.Tensor
    kind: Kind
    layers: tuple[int, ...]
    causal: bool = True
    attention_mask: torch.Tensor | None = None

    @property
    def max_product_error(self) -> float:
        product = self.attention * self.relative_norm * self.cosine
        return float((product - self.contribution).abs().max())

    def __repr__(self) -> str:  # shapes and the check, not four tensors of data
        axes = ["batch", "head", "query", "key"]
        if self.contribution.ndim == 5:
            axes.insert(0, "layer")
        shape = ", ".join(f"{a} {n}" for a, n in zip(axes, self.contribution.shape, strict=False))
        layers = _layer_span(self.layers)
        return (f"Decomposition(kind={self.kind!r}, {layers}, [{shape}]: .attention * "
                f".relative_norm * .cosine == .contribution within {self.max_product_error:.1e}"
                f"{', padded batch' if self.attention_mask is not None else ''}; "
                ".to_dataframe(query=-1) lists one query)")

    def to_dataframe(self, batch: int = 0, query: int = -1, str_tokens=None):
        """Long table (layer, head, key, token, attention, relative_norm, cosine, contribution) for one query.

        Args:
            batch: the batch row.
            query: the query position (negative counts from the end).
            str_tokens: the tokens' strings, for a ``token`` column (optional; for a row
                of a padded batch, its text's own tokens or the padded row's).

        Returns:
            A ``pandas.DataFrame`` with one row per (layer, head, key): the keys the query
            sees (``<= query`` on a decoder, every key on an encoder). In a padded batch
            (``attention_mask``) pad keys are left out, and ``query`` and ``key`` count
            from the row's first real token.

        Raises:
            InvalidArgumentError: a ``batch`` or ``query`` out of range, or a query that is
                padding.
        """
        import pandas as pd  # heavy: pandas, imported on use

        fields = ("attention", "relative_norm", "cosine", "contribution")
        tensors = {f: getattr(self, f) for f in fields}
        if self.attention.ndim == 4:  # one layer: add the layer axis back
            tensors = {f: t[None] for f, t in tensors.items()}
        rows = []
        n_layers, n_batch, n_heads, n_q, n_k = tensors["attention"].shape
        for name, value, n in (("batch", batch, n_batch), ("query", query, n_q)):
            if isinstance(value, bool) or not isinstance(value, int) or not -n <= value < n:
                raise InvalidArgumentError(f"{name}={value!r} is out of range: this decomposition "
                                           f"has {n} ({-n}..{n - 1}).")
        n_text = None if self.attention_mask is None else int(self.attention_mask[batch % n_batch].sum())
        if str_tokens is not None and len(str_tokens) not in (n_k, n_text):
            raise ShapeMismatchError(f"str_tokens has {len(str_tokens)} tokens but the keys are "
                                     f"{n_k}: pass the streamed text's model.to_str_tokens(...).")
        q, batch = query % n_q, batch % n_batch
        causal = self.causal and n_q == n_k
        keys, offset, at = list(range(q + 1 if causal else n_k)), 0, q
        if self.attention_mask is not None:  # a padded batch: its pad keys are no keys
            real = self.attention_mask[batch].bool().cpu()
            pos = n_k - n_q + q
            if not bool(real[pos]):
                raise InvalidArgumentError(
                    f"query={query} of batch row {batch} is padding: this row's text holds "
                    f"positions {real.nonzero().min().item()}..{real.nonzero().max().item()} "
                    "(attention_mask); pass one of them, e.g. query=-1 on a left-padded decoder.")
            offset = int(real.int().argmax())
            keys, at = [k for k in keys if bool(real[k])], pos - offset
            if str_tokens is not None and len(str_tokens) == int(real.sum()):
                str_tokens = [""] * offset + list(str_tokens)  # the text's own tokens
                str_tokens += [""] * (n_k - len(str_tokens))
        for li, layer in enumerate(self.layers):
            for h in range(n_heads):
                for k in keys:
                    row = {"layer": layer, "head": h, "query": at, "key": k - offset}
                    if str_tokens is not None:
                        row["token"] = str_tokens[k]
                    for f in fields:
                        row[f] = float(tensors[f][li, batch, h, q, k])
                    rows.append(row)
        return pd.DataFrame(rows)


@takes_model
def decompose(
    cache: Cache,
    model: ModelLike,
    layer: Layers = None,
    kind: Kind = "inter",
    attention_mask: torch.Tensor | None = None,
) -> Decomposition:
    """The factor split of the contribution weights (see :class:`Decomposition`).

    Args:
        cache: the cache of :func:`run_with_cache`.
        model: the TransformerLens model the cache comes from.
        layer: an int, a list of ints, or ``None`` for every layer.
        kind: ``"inter"`` or ``"intra"``: the output ``o`` the factors are taken against.
        attention_mask: ``[batch, pos]``, 1 on real tokens (pad positions get 0).

    Returns:
        A ``Decomposition`` (:class:`Decomposition`) whose ``attention * relative_norm *
        cosine`` equals its ``contribution``.

    Examples:
        >>> import cwlens, torch
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> logits, cache = cwlens.run_with_cache(model, "the cat sat on the mat")
        >>> parts = cwlens.decompose(cache, model, 0)
        >>> product = parts.attention * parts.relative_norm * parts.cosine
        >>> torch.allclose(product, parts.contribution, atol=1e-6)
        True
    """
    check_kind(kind)
    layers, single = adapter.resolve_requested_layers(model.n_layers, layer)
    adapter.require_cached(cache, model, layers, what="decompose")
    attention_mask = _mask(cache, attention_mask)
    parts: dict[str, list] = {f: [] for f in ("attention", "relative_norm", "cosine", "contribution")}
    for ly in layers:
        geo = adapter.geometry(cache, model, ly, attention_mask)
        parts["attention"].append(geo.attention())
        parts["relative_norm"].append(geo.relative_norm(kind).contiguous())
        parts["cosine"].append(geo.cosine(kind).contiguous())
        parts["contribution"].append(geo.contribution(kind))
    stacked = {f: (v[0] if single else torch.stack(v)) for f, v in parts.items()}
    return Decomposition(**stacked, kind=kind, layers=tuple(layers),
                         causal=not model.is_encoder, attention_mask=attention_mask)


@dataclass(frozen=True)
class Closure:
    """How far ``sum_h sum_j a_ij v~_j`` rebuilds the model's own attention output.

    Per layer: ``max_abs_error`` and ``relative_error`` = ||rebuilt - target|| / ||target||
    over all real positions, where target is the output projection's output minus b_O. Small values (float rounding) mean the
    cached pattern and values are exactly what the model mixed, so the weights are
    complete: they sum to 1 *and* explain the real output. A large value means a hook
    reads something else than the model computes (e.g. a norm after attention).

    Attributes:
        layers: the layers checked.
        max_abs_error: per layer, the largest absolute difference.
        relative_error: per layer, ``||rebuilt - target|| / ||target||``.

    Raises:
        NonFiniteError: an error that is NaN or inf (the rebuilt or the model's own output
            holds NaN or inf), naming the layers: a check that cannot be made never passes.

    Examples:
        >>> import cwlens
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> logits, cache = cwlens.run_with_cache(model, "the cat sat", closure=True)
        >>> check = cwlens.closure(cache, model)
        >>> check.layers, check.worst_relative_error < 1e-5
        ((0, 1), True)
    """

    layers: tuple[int, ...]
    max_abs_error: tuple[float, ...]
    relative_error: tuple[float, ...]

    def __post_init__(self) -> None:
        bad = [ly for ly, a, r in zip(self.layers, self.max_abs_error, self.relative_error, strict=True)
               if not (math.isfinite(a) and math.isfinite(r))]
        if bad:
            raise NonFiniteError(
                f"The closure check is NaN or inf in layer{'s' if len(bad) > 1 else ''} "
                f"{', '.join(map(str, bad))}: the heads' rebuilt output or the model's own "
                "attention output there holds NaN or inf (fp16 overflow, or a weight that is "
                "not finite: find it with torch.isfinite). Run the model in float32.")

    @property
    def worst_relative_error(self) -> float:
        """The largest per-layer relative error (NaN-aware: never a NaN dropped)."""
        return worst(self.relative_error)

    def __repr__(self) -> str:  # the worst layer, not a float per layer
        if not self.layers:
            return "Closure(no layer checked)"
        k = max(range(len(self.layers)), key=lambda i: self.relative_error[i])
        return (f"Closure({_layer_span(self.layers)}: heads x keys rebuild the attention output "
                f"within {self.worst_relative_error:.1e} relative (worst: layer {self.layers[k]}), "
                f"{max(self.max_abs_error):.1e} absolute; per layer: .relative_error, .max_abs_error)")


def _layer_span(layers: tuple[int, ...]) -> str:
    """``layer 5``, ``layers 0..29`` (consecutive) or ``layers [1, 3, 7]``."""
    if len(layers) == 1:
        return f"layer {layers[0]}"
    if list(layers) == list(range(layers[0], layers[0] + len(layers))):
        return f"layers {layers[0]}..{layers[-1]}"
    return f"layers {list(layers)}"


@takes_model
def closure(
    cache: Cache,
    model: ModelLike,
    layer: Layers = None,
    attention_mask: torch.Tensor | None = None,
) -> Closure:
    """Check the weights against what the heads wrote (see :class:`Closure`).

    Needs the cache from ``run_with_cache(..., closure=True)``.

    Args:
        cache: the cache of ``run_with_cache(model, input, closure=True)``.
        model: the TransformerLens model the cache comes from.
        layer: an int, a list of ints, or ``None`` for every layer.
        attention_mask: ``[batch, pos]``, 1 on real tokens: only real positions count.

    Returns:
        A ``Closure`` (:class:`Closure`) with the per-layer errors.

    Examples:
        >>> import cwlens
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> logits, cache = cwlens.run_with_cache(model, "the cat sat on the mat", closure=True)
        >>> cwlens.closure(cache, model, layer=1).relative_error[0] < 1e-5
        True
    """
    layers, _ = adapter.resolve_requested_layers(model.n_layers, layer)
    attention_mask = _mask(cache, attention_mask)  # a bad mask is named first, as elsewhere
    adapter.require_cached(cache, model, layers, closure=True, what="closure")
    errors = [
        closure_errors(adapter.geometry(cache, model, ly, attention_mask).layer_output,
                       adapter.heads_output(cache, model, ly), attention_mask)
        for ly in layers
    ]
    return Closure(tuple(layers), tuple(e[0] for e in errors), tuple(e[1] for e in errors))


def closure_errors(rebuilt: torch.Tensor, target: torch.Tensor,
                   attention_mask: torch.Tensor | None = None) -> tuple[float, float]:
    """``(max_abs_error, relative_error)`` of ``rebuilt`` against ``target`` on real positions."""
    target = target.to(rebuilt.dtype)
    diff = rebuilt - target
    if attention_mask is not None:
        keep = attention_mask.bool().to(diff.device)[..., None]
        diff, target = diff * keep, target * keep
    return float(diff.abs().max()), float(diff.norm() / target.norm().clamp_min(1e-30))


@takes_model
def names_filter(model: ModelLike, layers: Layers = None, closure: bool = False,
                 residual: bool = False):
    """A ``names_filter`` for ``model.run_with_cache`` that keeps only what cwlens reads.

    Args:
        model: the TransformerLens model.
        layers: an int, a list of ints, or ``None`` for every layer.
        closure: also keep the hook :func:`closure` compares against.
        residual: also the residual stream before and after each attention, the MLP
            outputs and the final norm's scale (what :mod:`cwlens.circuits` reads).

    Returns:
        A function of a hook name, True for the hooks cwlens reads (each layer's pattern
        and values).

    Examples:
        >>> import cwlens
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> logits, cache = model.run_with_cache("the cat sat", names_filter=cwlens.names_filter(model))
        >>> cwlens.contribution_weights(cache, model, layer=0).shape
        torch.Size([1, 4, 4, 4])
    """
    resolved, _ = adapter.resolve_layers(model.n_layers, layers)
    info = model.info
    extra: list[str] = []
    if residual:
        n = info.n_layers
        for layer in range(n):
            extra += [hook_names.resid_pre(layer), hook_names.resid_mid(layer), hook_names.mlp_out(layer)]
        extra += [hook_names.resid_post(n - 1), hook_names.final_scale()]
    return hook_names.names_filter_for(
        resolved, closure, generation=info.generation, post_attn_norm=info.post_attn_norm,
        extra=extra,
    )


@takes_model
def run_with_cache(
    model: ModelLike,
    input,
    layers: Layers = None,
    closure: bool = False,
    attention_mask: torch.Tensor | None = None,
    residual: bool = False,
    **kwargs,
):
    """``model.run_with_cache`` keeping only the hooks cwlens needs: returns ``(logits, cache)``.

    ``input``: a text, a list of texts or tokens ``[batch, pos]``. ``attention_mask``
    (``[batch, pos]``, 1 on real tokens) must have the tokens' shape. ``residual=True``
    keeps what :mod:`cwlens.circuits` reads too (see :func:`names_filter`).

    A list of texts of different lengths is padded as
    :func:`cwlens.engine.batching.pad_batch` pads it (left for decoders, right for
    encoders) and the cache remembers the mask: the measures read from it
    (:func:`contribution_weights`, :func:`importance`, :func:`decompose`, :func:`closure`,
    ...) leave the pad positions out without being told, and :func:`attention_mask_of`
    returns it (docs/inputs.md).

    Args:
        model: the TransformerLens model.
        input: a text, a list of texts or tokens ``[batch, pos]``.
        layers: an int, a list of ints, or ``None`` for every layer: the layers to keep.
        closure: also keep what :func:`closure` needs.
        attention_mask: ``[batch, pos]``, 1 on real tokens (see
            :func:`cwlens.engine.batching.pad_batch`).
        residual: also keep what :mod:`cwlens.circuits` reads (:func:`names_filter`).
        **kwargs: passed on to ``model.run_with_cache``.

    Returns:
        ``(logits, cache)``: the model's logits and an ``ActivationCache`` holding only
        the hooks cwlens reads (and the batch's attention mask, where it was padded).

    Raises:
        EmptyInputError: an empty text, an empty list or zero tokens.
        ShapeMismatchError: a mask whose shape differs from the tokens'.
        InvalidArgumentError: token ids that are not integers or outside the vocabulary.
        InputTooLongError: more tokens than the model's context where its positions are
            learned (GPT-2, BERT); rotary models run on with a ``CwlensWarning``
            (docs/inputs.md).

    Examples:
        >>> import cwlens, torch
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> logits, cache = cwlens.run_with_cache(model, "the cat sat on the mat")
        >>> logits.shape[:2]  # [batch, pos]
        torch.Size([1, 7])
        >>> len(cache) < 10  # pattern and values of 2 layers, nothing else
        True
    """
    # refuses empty, malformed or too long input and a mask unlike the tokens, before any
    # compute; pads a list of texts of different lengths (with its mask)
    input, attention_mask = batch_input(model, input, attention_mask)
    kwargs.update(model.forward_kwargs(attention_mask))
    logits, cache = model.cached_run(
        input, names_filter(model, layers, closure, residual), **kwargs
    )
    return logits, adapter.remember_mask(cache, attention_mask)


def attention_mask_of(cache: Cache) -> torch.Tensor | None:
    """The ``[batch, pos]`` attention mask a cache of :func:`run_with_cache` was made with
    (1 on real tokens), or None where nothing was padded: a list of texts of different
    lengths is padded (:func:`cwlens.engine.batching.pad_batch`: on the left for decoders,
    on the right for encoders), and the measures read the cache with this mask.

    Args:
        cache: the cache of :func:`run_with_cache`.

    Returns:
        The ``[batch, pos]`` mask (1 on real tokens), or None where the batch has no padding.

    Examples:
        >>> import cwlens
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")  # a real one: cwlens.load_model("smollm2-135m")
        >>> logits, cache = cwlens.run_with_cache(model, ["the cat sat on the mat", "a dog ran"])
        >>> cwlens.attention_mask_of(cache).tolist()  # the short text is left-padded
        [[1, 1, 1, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1, 1]]
        >>> logits.shape[:2]  # [batch, pos]: logits[:, -1] is each text's last token
        torch.Size([2, 7])
    """
    return adapter.cache_mask(cache)
