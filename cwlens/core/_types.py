"""The tensors cwlens reads and returns, with their shapes (TransformerLens dim names).

=====================  ==========================================  ===========================
name                   shape                                       where it comes from
=====================  ==========================================  ===========================
``Pattern``            ``[batch, head_index, query_pos, key_pos]``  ``blocks.{l}.attn.hook_pattern``
``Values``             ``[batch, key_pos, kv_head, d_head]``        ``blocks.{l}.attn.hook_v``
                                                                   (GQA keeps the kv heads;
                                                                   ``kv_head == head_index``
                                                                   without GQA)
``HeadZ``              ``[batch, query_pos, head_index, d_head]``   ``blocks.{l}.attn.hook_z``
``WO``                 ``[head_index, d_head, d_model]``            ``model.blocks[l].attn.W_O``
``Residual``           ``[batch, pos, d_model]``                    ``blocks.{l}.hook_attn_out``
``PairWeights``        ``[batch, head_index, query_pos, key_pos]``  every per-head measure
``TokenWeights``       ``[batch, query_pos, key_pos]``              head-summed (token level)
``QueryNorms``         ``[batch, head_index, query_pos]``           ``||o_i||`` per head
``KeyNorms``           ``[batch, head_index, key_pos]``             ``||v~_j||`` per head
=====================  ==========================================  ===========================

When several layers are asked for, results get a leading ``layer`` axis.
All results are ``float32`` whatever the cache dtype.
"""

from collections.abc import Iterable
from typing import Any, Literal, Protocol, SupportsIndex, runtime_checkable

import torch
from jaxtyping import Bool, Float, Int

from cwlens.core.metrics import GEOMETRY, HIERARCHY, KINDS, Kind, Mode, Scope

__all__ = ["KINDS", "Kind", "Mode", "Scope"]  # re-exported from cwlens.core.metrics

Pattern = Float[torch.Tensor, "batch head_index query_pos key_pos"]
Values = Float[torch.Tensor, "batch key_pos kv_head d_head"]
HeadZ = Float[torch.Tensor, "batch query_pos head_index d_head"]
WO = Float[torch.Tensor, "head_index d_head d_model"]
Residual = Float[torch.Tensor, "batch pos d_model"]
PairWeights = Float[torch.Tensor, "batch head_index query_pos key_pos"]
TokenWeights = Float[torch.Tensor, "batch query_pos key_pos"]
# what the public measures return: one layer asked for, no leading axis; several, a
# leading ``layer`` axis (``*layer`` matches zero or one dimension)
LayerPairWeights = Float[torch.Tensor, "*layer batch head_index query_pos key_pos"]
LayerTokenWeights = Float[torch.Tensor, "*layer batch query_pos key_pos"]
QueryNorms = Float[torch.Tensor, "batch head_index query_pos"]
KeyNorms = Float[torch.Tensor, "batch head_index key_pos"]
# True / 1 on real tokens: a bool mask, or the 0/1 integer attention_mask of pad_batch
PositionMask = Bool[torch.Tensor, "batch pos"] | Int[torch.Tensor, "batch pos"]

# -- the option strings (checked at run time too: a bad value raises UnknownOptionError) --
# metric names are plain strings: cwlens.core.metrics.REGISTRY lists them (one entry each)
Generation = Literal["auto", "bridge", "hooked"]
ModelGeneration = Literal["bridge", "hooked"]  # what a loaded model is

# the paper's four metrics (cwlens.importance); the registry is cwlens.core.metrics
METRICS: tuple[str, ...] = HIERARCHY
# every per-entry measure the streaming engine computes (METRICS, |contribution|, alti)
STREAM_METRICS: tuple[str, ...] = GEOMETRY

# One layer (an int, a NumPy integer, a 0-d integer tensor), several (an iterable of
# those, a 1-d array or tensor), or None for all. Validated by adapter.resolve_layers.
Layers = SupportsIndex | Iterable[SupportsIndex] | torch.Tensor | None



class TLModel(Protocol):
    """What cwlens needs from a model (both TransformerLens generations satisfy it): a
    ``cfg`` with ``n_layers``, ``n_heads``, ``d_head``, ``d_model``, per-block
    ``attn.W_O``, and the usual TransformerLens methods."""

    cfg: Any
    blocks: Any

    def run_with_cache(self, *args: Any, **kwargs: Any) -> Any: ...

    def to_tokens(self, *args: Any, **kwargs: Any) -> Any: ...

    def hooks(self, *args: Any, **kwargs: Any) -> Any: ...


@runtime_checkable
class Cache(Protocol):
    """An activation cache: a dict of hook name -> tensor, or TransformerLens'
    ``ActivationCache`` (which is not a ``Mapping``: it has no ``__contains__``)."""

    def __getitem__(self, name: str, /) -> torch.Tensor: ...

    def keys(self) -> Any: ...
