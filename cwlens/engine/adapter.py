"""The one place that knows TransformerLens models and caches.

Works with anything that looks like a TransformerLens model (``HookedTransformer``,
``HookedEncoder`` from 3.x, ``TransformerBridge`` from 4.x): a ``cfg`` with ``n_layers``,
``n_heads``, ``d_head``, ``d_model`` and per-block ``attn.W_O``. It turns a cache into the
tensors that :mod:`cwlens.core` takes, and raises a clear error when something is off.
"""

import math
import operator
from collections.abc import Iterable
from typing import Any, cast

import torch

from cwlens.core import AttentionGeometry
from cwlens.core._types import Cache
from cwlens.core._types import Layers as Layers  # re-exported: measures and users import it here
from cwlens.core.alti import AttentionOutputNorm, PostNorm
from cwlens.engine import hook_names
from cwlens.engine.handle import ModelHandle
from cwlens.engine.handle import ModelInfo as ModelInfo  # re-exported
from cwlens.errors import (
    InvalidArgumentError,
    LayerOutOfRangeError,
    MissingHookError,
    NonFiniteError,
    ShapeMismatchError,
    UnsupportedModelError,
)


def require_next_token_model(info: ModelInfo, what: str, alternative: str) -> None:
    """Raise :class:`~cwlens.errors.UnsupportedModelError` where the model (``info``: its
    :attr:`~cwlens.engine.handle.ModelHandle.info`) is an encoder.

    Next-token NLL / perplexity read ``logits[:, t]`` as ``P(t_{t+1} | t_<=t)``: a
    bidirectional masked-LM's logits are not that, and the scores would be meaningless.
    """
    if info.is_encoder:
        raise UnsupportedModelError(
            f"{what} scores next-token loss, but this model is an encoder (bidirectional "
            f"attention, masked-LM logits), so the numbers would be meaningless. {alternative}"
        )


def _layer_index(item: object) -> int | None:
    """``item`` as a Python int if it is an integer (int, NumPy integer, 0-d integer
    tensor), else None. Bools are not layers, although Python counts them as ints."""
    if isinstance(item, torch.Tensor):
        if item.ndim != 0 or item.dtype == torch.bool or item.is_floating_point() or item.is_complex():
            return None
        return int(item.item())
    if isinstance(item, bool) or type(item).__name__ == "bool_":  # Python and NumPy bools
        return None
    if isinstance(item, int):
        return int(item)
    if hasattr(item, "__index__") and not isinstance(item, str):
        try:
            return operator.index(item)  # NumPy integers
        except TypeError:
            return None
    return None


def resolve_layers(n_layers: int, layer: object) -> tuple[list[int], bool]:
    """``(layers, single)``: the layer list of a model of ``n_layers`` layers, and whether
    one int was asked for.

    Accepts an int, a NumPy integer or a 0-d integer tensor (one layer), an iterable of
    those (a list, a 1-d array or tensor), or None (all layers). Negative indices count
    from the end. Floats, bools and strings raise :class:`LayerOutOfRangeError`.
    """
    n = n_layers
    single = layer is not None and _layer_index(layer) is not None
    if layer is None:
        items: list[Any] = list(range(n))
    elif single:
        items = [layer]
    elif isinstance(layer, str | bytes) or (isinstance(layer, torch.Tensor) and layer.ndim != 1):
        items = [layer]  # refused below
    else:
        try:
            items = list(cast(Iterable[Any], layer))
        except TypeError:
            items = [layer]  # a float or other scalar: refused below
    layers = []
    for item in items:
        index = _layer_index(item)
        if index is None:
            raise LayerOutOfRangeError(
                f"Layers must be ints (or NumPy / 0-d torch integers); got {item!r}. "
                f"Pass an int in 0..{n - 1}, a list of them, or None for all layers."
            )
        if not -n <= index < n:
            raise LayerOutOfRangeError(
                f"Layer {index} is out of range: this model has {n} layers (0..{n - 1}); "
                "pass layer=None for all of them (CLI: --layers all)."
            )
        layers.append(index % n)
    return layers, single


def resolve_requested_layers(n_layers: int, layer: object) -> tuple[list[int], bool]:
    """:func:`resolve_layers` for a layer argument a user gave: an empty list, or a layer
    listed twice, raise :class:`LayerOutOfRangeError` (an empty stack, or a layer counted
    twice, would follow)."""
    layers, single = resolve_layers(n_layers, layer)
    if not layers:
        raise LayerOutOfRangeError(
            f"no layer given ({layer!r} is empty): pass an int, a list of them, or None for "
            "all layers")
    twice = sorted({ly for ly in layers if layers.count(ly) > 1})
    if twice:
        raise LayerOutOfRangeError(
            f"layer {', '.join(map(str, twice))} listed twice in {layer!r} (negative indices "
            "count from the end): give each layer once")
    return layers, single


def post_attention_layernorm(handle: ModelHandle, layer: int):
    """The norm through which ``layer``'s attention output reaches the residual stream, for
    full ALTI (:mod:`cwlens.core.alti`): a :class:`~cwlens.core.alti.PostNorm` for
    BERT-like post-LN encoders (``LN(resid_pre + attn_out)``: the block's ``ln1``), an
    :class:`~cwlens.core.alti.AttentionOutputNorm` for models with an RMSNorm between the
    heads and the residual sum (Gemma-2/3: ``resid_pre + N(attn_out)``), or None for pre-LN
    models (the norm sits before the values and the residual sum is the whole) and for
    models without any norm (a bidirectional tracr model, :mod:`cwlens.groundtruth`)."""
    if handle.info.post_attn_norm:
        gamma, eps = handle.attention_output_norm(layer)
        return AttentionOutputNorm(gamma.detach(), eps)
    if not handle.is_encoder or not handle.normalized:  # no norm at all: tracr's models
        return None
    ln, weight, bias, eps = handle.post_attention_norm(layer)
    if weight is None or eps is None:
        raise UnsupportedModelError(
            f"alti: cannot read the post-attention LayerNorm of encoder layer {layer} "
            f"({ln} has no weight/eps). Use metric 'alti_attention' instead."
        )
    if bias is None:
        bias = torch.zeros_like(weight)
    return PostNorm(weight.detach(), bias.detach(), float(eps))


def require_metrics(handle: ModelHandle, metrics) -> None:
    """Refuse, before any forward pass, a metric the model cannot give: full ``alti`` where
    the post-attention norm is not one cwlens linearises (checked on the first layer)."""
    if "alti" in metrics and handle.info.post_attn_norm:
        post_attention_layernorm(handle, 0)


def read(cache: Cache, name: str, handle: ModelHandle, closure=False):
    if not callable(getattr(cache, "keys", None)):
        raise InvalidArgumentError(
            f"expected an activation cache (from cwlens.run_with_cache(model, tokens)) where "
            f"the cache goes; got {type(cache).__name__}. The order is (cache, model).")
    if name in cache.keys():
        return cache[name]
    layer = int(name.split(".")[1])
    require_cached(cache, handle, [layer], closure=closure, what="this call")
    raise MissingHookError(f"The cache has no {name!r}.")  # require_cached names it first


def call_hooks(handle: ModelHandle, layers: Iterable[int], closure: bool = False,
               residual: bool = False) -> list[str]:
    """The hooks a measure of ``layers`` reads from a cache: each layer's pattern and
    values; ``closure``: the heads' output it is checked against; ``residual``: the
    residual stream entering the layer (full ALTI)."""
    info = handle.info
    names = []
    for layer in layers:
        names += [hook_names.pattern(layer), hook_names.values(layer)]
        if residual:
            names.append(hook_names.resid_pre(layer))
        if closure:
            names.append(hook_names.closure_target(layer, info.generation, info.post_attn_norm))
    return names


def require_cached(cache: Cache, handle: ModelHandle, layers: Iterable[int], closure: bool = False,
                   residual: bool = False, what: str = "this call") -> None:
    """Refuse, before anything is computed, a cache without every hook the call needs
    (:func:`call_hooks`): :class:`~cwlens.errors.MissingHookError` names the hooks it
    lacks, those the call needs, and the ``run_with_cache`` / ``names_filter`` arguments
    that keep them."""
    if not callable(getattr(cache, "keys", None)):
        return  # read() names a cache that is not one
    layers = list(layers)
    needed = call_hooks(handle, layers, closure, residual)
    held = set(cache.keys())
    missing = [n for n in needed if n not in held]
    if not missing:
        return
    n = handle.n_layers
    span = (f"layer {layers[0]}" if len(layers) == 1 else
            "every layer" if layers == list(range(n)) else f"layers {layers}")
    args = "".join([f", layers={layers}" if layers != list(range(n)) else "",
                    ", closure=True" if closure else ""])

    def listed(names: list[str]) -> str:
        return ", ".join(map(repr, names[:6])) + (f", ... ({len(names) - 6} more)" if len(names) > 6 else "")

    kinds = sorted({m.rsplit(".", 1)[-1] for m in needed})
    raise MissingHookError(
        f"{what} reads {', '.join(kinds)} of {span} ({len(needed)} hooks); the cache lacks "
        f"{len(missing)}: {listed(missing)}. Run the model with "
        f"cwlens.run_with_cache(model, tokens{args}), or pass "
        f"names_filter=cwlens.names_filter(model{args}) to model.run_with_cache.")


#: The attribute under which :func:`remember_mask` keeps a cache's attention mask.
MASK_ATTRIBUTE = "cwlens_attention_mask"


def remember_mask(cache: Cache, attention_mask: torch.Tensor | None) -> Cache:
    """``cache``, remembering the ``[batch, pos]`` mask its batch was run with, so that
    every measure read from it leaves the pad positions out without being told
    (``cwlens.run_with_cache`` of a list of texts pads it and remembers the mask)."""
    if attention_mask is not None:
        setattr(cache, MASK_ATTRIBUTE, attention_mask)
    return cache


def cache_mask(cache: Cache) -> torch.Tensor | None:
    """The attention mask :func:`remember_mask` kept with ``cache`` (None: unpadded)."""
    return getattr(cache, MASK_ATTRIBUTE, None)


def geometry(
    cache: Cache,
    handle: ModelHandle,
    layer: int,
    attention_mask: torch.Tensor | None = None,
) -> AttentionGeometry:
    """The :class:`~cwlens.core.AttentionGeometry` of one layer of a cached run
    (``attention_mask`` None: the mask remembered with the cache, :func:`cache_mask`)."""
    if attention_mask is None:
        attention_mask = cache_mask(cache)
    pattern = read(cache, hook_names.pattern(layer), handle)
    v = read(cache, hook_names.values(layer), handle)
    resid = hook_names.resid_pre(layer)
    residual = cache[resid] if resid in cache.keys() else None  # for ALTI, where cached
    if attention_mask is not None:
        _check_mask_matches(pattern, attention_mask, layer)
    return layer_geometry(handle, layer, pattern, v, attention_mask, residual)


MASK_LEAK = 1e-3  # attention a real query may put on keys the mask calls padding


def _check_mask_matches(pattern: torch.Tensor, attention_mask, layer: int) -> None:
    """A cached run made with one mask and read with another gives wrong weights silently
    (a padded batch cached without its mask was off by 0.16): the real queries of a run
    made with this mask put no attention on the keys it calls padding."""
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.ndim != 2 \
            or attention_mask.shape[0] != pattern.shape[0] or attention_mask.shape[1] != pattern.shape[-1]:
        return  # the shape checks downstream name that
    real = attention_mask.to(pattern.device).bool()
    pad = (~real).to(pattern.dtype)[:, None, :, None]  # [b, 1, k, 1]
    leak = (pattern @ pad)[..., 0]  # [b, h, q]: attention on padding keys
    queries = real[:, -pattern.shape[2]:][:, None, :].expand_as(leak)
    worst = float(leak[queries].float().max()) if bool(queries.any()) else 0.0
    if worst > MASK_LEAK:
        raise ShapeMismatchError(
            f"Layer {layer}: the cache does not match attention_mask: real queries put up to "
            f"{worst:.3f} of their attention on positions the mask marks as padding, so the "
            "cache was made without this mask (or with another). Cache the batch with it: "
            "cwlens.run_with_cache(model, tokens, attention_mask=mask).")


def layer_geometry(
    handle: ModelHandle,
    layer: int,
    pattern: torch.Tensor,
    v: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> AttentionGeometry:
    """The geometry of one layer from its ``hook_pattern`` and ``hook_v`` tensors
    (from a cache or caught by hooks during a forward pass), checked against the model.
    ``residual`` (``hook_resid_pre``), where given, is attached for ALTI
    (:meth:`~cwlens.core.AttentionGeometry.attach_residual`; the norm is read lazily)."""
    info = handle.info
    # hook_v holds the model's kv heads. TransformerLens 3.x with
    # cfg.ungroup_grouped_query_attention repeats them to one per query head: only then
    # is a cache with n_heads value heads on a GQA model what this model made.
    value_heads = handle.value_heads()
    if pattern.shape[1] != info.n_heads or v.shape[2] not in value_heads:
        raise ShapeMismatchError(
            f"Layer {layer}: the cache has {pattern.shape[1]} query heads and {v.shape[2]} "
            f"value heads, but the model has {info.n_heads} query heads and "
            f"{info.n_kv_heads} kv heads. Was the cache made by another model (an MHA "
            "cache on a GQA model)? Rerun this model with cwlens.run_with_cache."
        )
    if v.shape[-1] != info.d_head:
        raise ShapeMismatchError(
            f"Layer {layer}: hook_v has d_head={v.shape[-1]}, the model {info.d_head}. "
            "Was the cache made by another model?"
        )
    mask = None if attention_mask is None else attention_mask.bool()
    geo = AttentionGeometry(pattern, v, handle.W_O(layer), position_mask=mask, layer=layer)
    if residual is not None:
        geo.attach_residual(residual.detach(), handle.b_O(layer),
                            lambda: post_attention_layernorm(handle, layer))
    return geo


def heads_output(cache: Cache, handle: ModelHandle, layer: int) -> torch.Tensor:
    """What the model's heads wrote in this layer, without b_O: ``[batch, pos, d_model]``.

    Read from :func:`closure_hook` (for models with a norm after attention on
    TransformerLens 3.x, rebuilt from ``hook_z`` and W_O).
    """
    name = closure_hook(handle, layer)
    return heads_output_from(handle, layer, read(cache, name, handle, closure=True))


def closure_hook(handle: ModelHandle, layer: int) -> str:
    """The hook holding what the heads wrote (see :func:`cwlens.engine.hook_names.closure_target`)."""
    info = handle.info
    return hook_names.closure_target(layer, info.generation, info.post_attn_norm)


def heads_output_from(handle: ModelHandle, layer: int, out: torch.Tensor) -> torch.Tensor:
    """The heads' summed output without b_O, from the tensor at :func:`closure_hook`."""
    if closure_hook(handle, layer) == hook_names.z(layer):
        return torch.einsum("bqhd,hdm->bqm", out.float(), handle.W_O(layer).float())
    return out.float() - handle.b_O(layer).float().to(out.device)


def check_residual_model(handle: ModelHandle, what: str) -> ModelInfo:
    """Refuse (:class:`UnsupportedModelError`) a model that is not a pre-norm decoder
    whose residual stream is the plain sum ``embedding + sum_l (attention_l + mlp_l)``
    with logits ``LN_final(x) W_U + b_U``, which the circuit tools assume."""
    problems = handle.residual_problems()
    if problems:
        raise UnsupportedModelError(
            f"{what} needs a pre-norm decoder whose residual stream is a plain sum of the "
            f"blocks' outputs, but for this model {'; '.join(problems)}. Use Llama-, "
            "Mistral-, Qwen- or GPT-2-style models (e.g. smollm2-135m, gpt2)."
        )
    return handle.info


def check_residual_sum(cache: Cache, handle: ModelHandle, what: str, tolerance: float = 1e-3) -> None:
    """Check, per layer, that the residual stream is the plain sum the circuit tools assume:
    ``resid_mid - resid_pre = sum_h sum_j a_ij v~_j + b_O`` and ``next resid - resid_mid = mlp_out``
    (relative error ``<= tolerance``). A norm after attention or after the MLP (Gemma-2/3)
    or a post-norm block fails it. On a padded batch (the mask remembered with the cache,
    :func:`cache_mask`) only the real positions are compared: a pad query's output is no
    token's and the measures leave it out."""
    n = handle.n_layers
    mask = cache_mask(cache)
    for layer in range(n):
        pre = read(cache, hook_names.resid_pre(layer), handle).double()
        mid = read(cache, hook_names.resid_mid(layer), handle).double()
        nxt = hook_names.resid_pre(layer + 1) if layer + 1 < n else hook_names.resid_post(layer)
        post = read(cache, nxt, handle).double()
        heads = geometry(cache, handle, layer).layer_output.double()
        attn = heads + handle.b_O(layer).double().to(heads.device)
        mlp = read(cache, hook_names.mlp_out(layer), handle).double()
        parts = (("attention", "the heads' a_ij v~_j + b_O", mid - pre, attn),
                 ("MLP", "hook_mlp_out", post - mid, mlp))
        for part, hook, added, rebuilt in parts:
            if mask is not None and mask.shape == added.shape[:2]:
                real = mask.to(added.device).bool()
                added, rebuilt = added[real], rebuilt.expand_as(added)[real]
            err = float((added - rebuilt).norm() / added.norm().clamp_min(1e-30))
            if not math.isfinite(err):  # NaN > tolerance is False: it would pass
                raise NonFiniteError(
                    f"{what}: in layer {layer}, the residual stream or {hook} holds NaN or inf "
                    f"(the {part} block's check is {err}): fp16 overflow or a weight that is not "
                    "finite. Run the model in float32, or find the parameter with torch.isfinite.")
            if err > tolerance:
                raise UnsupportedModelError(
                    f"{what}: in layer {layer}, what the {part} block added to the residual "
                    f"stream differs from {hook} "
                    f"by {err:.1e} (relative). It needs pre-norm residual blocks without a norm "
                    "after attention or MLP (Llama-, Mistral-, Qwen- or GPT-2-style models)."
                )
