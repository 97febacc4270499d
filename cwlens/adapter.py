"""The one place that knows TransformerLens models and caches.

Works with anything that looks like a TransformerLens model (``HookedTransformer``,
``HookedEncoder`` from 3.x, ``TransformerBridge`` from 4.x): a ``cfg`` with ``n_layers``,
``n_heads``, ``d_head``, ``d_model`` and per-block ``attn.W_O``. It turns a cache into the
tensors that :mod:`cwlens.core` takes, and raises a clear error when something is off.
"""

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import torch

from cwlens import hook_names
from cwlens._types import Cache, ModelGeneration
from cwlens._types import Layers as Layers  # re-exported: measures and users import it here
from cwlens._types import TLModel as TLModel  # re-exported
from cwlens.core import AttentionGeometry
from cwlens.errors import (
    LayerOutOfRangeError,
    MissingHookError,
    ShapeMismatchError,
    UnsupportedModelError,
)


@dataclass(frozen=True)
class ModelInfo:
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_model: int
    generation: ModelGeneration  # "bridge" (TransformerLens 4.x) or "hooked" (3.x)
    post_attn_norm: bool  # a norm between the heads and hook_attn_out (Gemma-2/3)

    @classmethod
    def of(cls, model: TLModel) -> "ModelInfo":
        cfg = model.cfg
        n_kv = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
        generation: ModelGeneration = "bridge" if type(model).__name__ == "TransformerBridge" else "hooked"
        post = bool(getattr(cfg, "use_normalization_before_and_after", False))
        return cls(cfg.n_layers, cfg.n_heads, n_kv, cfg.d_head, cfg.d_model, generation, post)

    def hooks(self, layers: list[int], closure: bool = False) -> list[str]:
        return hook_names.needed(layers, closure, self.generation, self.post_attn_norm)


def is_encoder(model: TLModel) -> bool:
    """Bidirectional attention (BERT-like): ``HookedEncoder`` or a bridge with ``attention_dir``.

    The one place cwlens decides "encoder"; everything else asks here.
    """
    if type(model).__name__ == "HookedEncoder":
        return True
    return getattr(model.cfg, "attention_dir", "causal") == "bidirectional"


def attention_window(model: TLModel, layer: int) -> int | None:
    """The sliding-window size of ``layer`` (query ``i`` sees keys ``i - w < j <= i``), or
    None where the layer attends to the whole context.

    TransformerLens 4.x: ``cfg.layer_types`` (``"sliding_attention"``) with the window
    from ``cfg.sliding_window`` or the wrapped Hugging Face config; 3.x: ``cfg.attn_types``
    (``"local"``) with ``cfg.window_size``.
    """
    cfg = model.cfg
    hf_cfg = getattr(getattr(model, "original_model", None), "config", None)
    layer_types = getattr(cfg, "layer_types", None) or getattr(hf_cfg, "layer_types", None)
    if layer_types is not None:
        if layer_types[layer] != "sliding_attention":
            return None
        window = getattr(cfg, "sliding_window", None) or getattr(hf_cfg, "sliding_window", None)
        return None if window is None else int(window)
    attn_types = getattr(cfg, "attn_types", None)
    if getattr(cfg, "use_local_attn", False) and attn_types is not None:
        return int(cfg.window_size) if attn_types[layer] == "local" else None
    return None


def context_length(model: TLModel) -> int | None:
    """The context length the model was configured with (``cfg.n_ctx``; the Hugging Face
    ``max_position_embeddings``), or None where the config has none. Texts longer than
    this run past what the model was trained on."""
    n_ctx = getattr(model.cfg, "n_ctx", None)
    return int(n_ctx) if isinstance(n_ctx, int) and n_ctx > 0 else None


def vocab_size(model: TLModel) -> int | None:
    """The number of token ids the embedding holds (``cfg.d_vocab``), or None if unknown."""
    n = getattr(model.cfg, "d_vocab", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def text_length(model: TLModel, text: str) -> int:
    """How many tokens ``model`` makes of ``text`` (with its BOS / [CLS] ... [SEP]), not cut
    at the context as ``model.to_tokens`` and ``model(text)`` silently do."""
    from cwlens.batching import token_ids

    return len(token_ids(model, text, truncate=False))


def require_next_token_model(model: TLModel, what: str, alternative: str) -> None:
    """Raise :class:`~cwlens.errors.UnsupportedModelError` where ``model`` is an encoder.

    Next-token NLL / perplexity read ``logits[:, t]`` as ``P(t_{t+1} | t_<=t)``: a
    bidirectional masked-LM's logits are not that, and the scores would be meaningless.
    """
    if is_encoder(model):
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


def resolve_layers(model: TLModel, layer: object) -> tuple[list[int], bool]:
    """``(layers, single)``: the layer list, and whether one int was asked for.

    Accepts an int, a NumPy integer or a 0-d integer tensor (one layer), an iterable of
    those (a list, a 1-d array or tensor), or None (all layers). Negative indices count
    from the end. Floats, bools and strings raise :class:`LayerOutOfRangeError`.
    """
    n = model.cfg.n_layers
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
                "pass layer=None for all of them."
            )
        layers.append(index % n)
    return layers, single


def forward_kwargs(model: TLModel, attention_mask: torch.Tensor | None) -> dict[str, Any]:
    """The keyword that passes ``attention_mask`` to this model's forward (or nothing).

    TransformerLens 3.x's ``HookedEncoder`` names it ``one_zero_attention_mask``.
    """
    if attention_mask is None:
        return {}
    key = "one_zero_attention_mask" if type(model).__name__ == "HookedEncoder" else "attention_mask"
    return {key: attention_mask}


def has_hook(model: TLModel, name: str) -> bool:
    """Whether ``model`` has a hook point called ``name`` (aliases included)."""
    try:
        return name in model.hook_dict
    except AttributeError:
        return False


def W_O(model: TLModel, layer: int) -> torch.Tensor:
    """``[head_index, d_head, d_model]`` output projection of one layer (detached)."""
    return model.blocks[layer].attn.W_O.detach()


def b_O(model: TLModel, layer: int) -> torch.Tensor:
    """``[d_model]`` output bias of one layer (zeros where the model has none)."""
    try:
        bias = model.blocks[layer].attn.b_O
    except AttributeError:
        bias = None
    if bias is None:
        w = W_O(model, layer)
        return torch.zeros(w.shape[-1], dtype=w.dtype, device=w.device)
    return bias.detach()


def post_attention_layernorm(model: TLModel, layer: int):
    """The LayerNorm applied to the residual stream right after ``layer``'s attention, as
    a :class:`~cwlens.core.alti.PostNorm`, or None for pre-LN models (the norm sits
    before the values and the residual sum is the whole).

    Encoders are BERT-like post-LN (``LN(resid_pre + attn_out)``: the block's ``ln1``).
    Models with a norm between the heads and the residual (Gemma-2/3) raise
    :class:`~cwlens.errors.UnsupportedModelError`: ALTI's parts are not defined there yet.
    """
    from cwlens.core.alti import PostNorm

    info = ModelInfo.of(model)
    if info.post_attn_norm:
        raise UnsupportedModelError(
            f"alti: this model normalises the attention output before the residual sum "
            f"(layer {layer}), and the ALTI parts through that norm are not implemented. "
            "Use metric 'alti_attention' (the attention output as the whole) instead."
        )
    if not is_encoder(model):
        return None
    ln = model.blocks[layer].ln1
    weight = getattr(ln, "w", None)
    if weight is None:
        weight = getattr(ln, "weight", None)
    bias = getattr(ln, "b", None)
    if bias is None:
        bias = getattr(ln, "bias", None)
    eps = getattr(ln, "eps", None) or getattr(ln, "variance_epsilon", None) or getattr(model.cfg, "eps", None)
    if weight is None or eps is None:
        raise UnsupportedModelError(
            f"alti: cannot read the post-attention LayerNorm of encoder layer {layer} "
            f"({type(ln).__name__} has no weight/eps). Use metric 'alti_attention' instead."
        )
    if bias is None:
        bias = torch.zeros_like(weight)
    return PostNorm(weight.detach(), bias.detach(), float(eps))


def read(cache: Cache, name: str, model: TLModel, closure=False):
    if name in cache.keys():
        return cache[name]
    layer = int(name.split(".")[1])
    raise MissingHookError(
        f"The cache has no {name!r}. cwlens needs {ModelInfo.of(model).hooks([layer], closure)}. "
        "Run the model with `cwlens.run_with_cache(model, tokens)`, or pass "
        "`names_filter=cwlens.names_filter(model)` to `model.run_with_cache`."
    )


def geometry(
    cache: Cache,
    model: TLModel,
    layer: int,
    attention_mask: torch.Tensor | None = None,
) -> AttentionGeometry:
    """The :class:`~cwlens.core.AttentionGeometry` of one layer of a cached run."""
    pattern = read(cache, hook_names.pattern(layer), model)
    v = read(cache, hook_names.values(layer), model)
    resid = hook_names.resid_pre(layer)
    residual = cache[resid] if resid in cache.keys() else None  # for ALTI, where cached
    return layer_geometry(model, layer, pattern, v, attention_mask, residual)


def layer_geometry(
    model: TLModel,
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
    info = ModelInfo.of(model)
    # hook_v holds the model's kv heads. TransformerLens 3.x with
    # cfg.ungroup_grouped_query_attention repeats them to one per query head: only then
    # is a cache with n_heads value heads on a GQA model what this model made.
    ungrouped = bool(getattr(model.cfg, "ungroup_grouped_query_attention", False))
    value_heads = {info.n_kv_heads, info.n_heads} if ungrouped else {info.n_kv_heads}
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
    geo = AttentionGeometry(pattern, v, W_O(model, layer), position_mask=mask, layer=layer)
    if residual is not None:
        geo.attach_residual(residual.detach(), b_O(model, layer),
                            lambda: post_attention_layernorm(model, layer))
    return geo


def heads_output(cache: Cache, model: TLModel, layer: int) -> torch.Tensor:
    """What the model's heads wrote in this layer, without b_O: ``[batch, pos, d_model]``.

    Read from :func:`closure_hook` (for models with a norm after attention on
    TransformerLens 3.x, rebuilt from ``hook_z`` and W_O).
    """
    name = closure_hook(model, layer)
    return heads_output_from(model, layer, read(cache, name, model, closure=True))


def closure_hook(model: TLModel, layer: int) -> str:
    """The hook holding what the heads wrote (see :func:`cwlens.hook_names.closure_target`)."""
    info = ModelInfo.of(model)
    return hook_names.closure_target(layer, info.generation, info.post_attn_norm)


def heads_output_from(model: TLModel, layer: int, out: torch.Tensor) -> torch.Tensor:
    """The heads' summed output without b_O, from the tensor at :func:`closure_hook`."""
    if closure_hook(model, layer) == hook_names.z(layer):
        return torch.einsum("bqhd,hdm->bqm", out.float(), W_O(model, layer).float())
    return out.float() - b_O(model, layer).float().to(out.device)
