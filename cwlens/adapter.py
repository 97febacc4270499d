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
from cwlens.errors import LayerOutOfRangeError, MissingHookError, ShapeMismatchError


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
    return AttentionGeometry(pattern, v, W_O(model, layer), position_mask=mask, layer=layer)


def heads_output(cache: Cache, model: TLModel, layer: int) -> torch.Tensor:
    """What the model's heads wrote in this layer, without b_O: ``[batch, pos, d_model]``.

    Read from :func:`cwlens.hook_names.closure_target` (for models with a norm after
    attention on TransformerLens 3.x, rebuilt from ``hook_z`` and W_O).
    """
    info = ModelInfo.of(model)
    name = hook_names.closure_target(layer, info.generation, info.post_attn_norm)
    out = read(cache, name, model, closure=True)
    if name == hook_names.z(layer):
        return torch.einsum("bqhd,hdm->bqm", out.float(), W_O(model, layer).float())
    return out.float() - b_O(model, layer).float().to(out.device)
