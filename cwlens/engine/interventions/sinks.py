"""Attention-sink interventions: hook factories and a context manager that cannot leak.

Two interventions, each a small named hook factory over the tensor maps in
:mod:`cwlens.core.sinks`:

- :func:`sink_rate_hook` on ``hook_pattern``: set the attention on the sink to ``s`` and
  rescale the tail by ``(1 - s) / (1 - a_i0)`` (the sink-rate sweep, ``METHOD.md`` s. 5);
  with ``s = a_i0`` (per query) it is the identity.
- :func:`value_scale_hook` on ``hook_v``: scale the value vector of one position per row
  (the sink, or a random control position) by ``scale``; 1 is the identity, 0 removes
  exactly ``a_i0 v~_0`` from every head output.

The sink of a row is its first real token (:func:`cwlens.core.sinks.first_real_index`),
so left-padded batches work: pass the same ``attention_mask`` as to the model.

    with sinks.applied(model, sinks.sink_value_hooks(model, 0.0, sink_index)):
        logits = model(tokens, attention_mask=mask)
    # hooks are gone here, even if the forward raised
"""

from collections.abc import Callable
from typing import Any

import torch

from cwlens.core.sinks import scale_position, set_sink_rate
from cwlens.engine import hook_names
from cwlens.engine.adapter import Layers, resolve_requested_layers
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle
from cwlens.engine.interventions.value_masking import hooks_applied
from cwlens.engine.models.blockwise import block_rows, current_block

Hook = tuple[str, Callable[[torch.Tensor, Any], torch.Tensor]]


def sink_rate_hook(s, sink_index: torch.Tensor | None = None):
    """A ``hook_pattern`` hook setting the sink rate to ``s`` (float or ``[batch, head, query]``).

    ``sink_index``: ``[batch]`` sink position per row (default 0).
    """

    def set_sink_rate_hook(pattern: torch.Tensor, hook=None) -> torch.Tensor:
        s_ = s.to(pattern.device, pattern.dtype) if torch.is_tensor(s) else s
        idx = None if sink_index is None else sink_index.to(pattern.device)
        block = current_block()  # blockwise attention: this block's rows only
        if block is None:
            return set_sink_rate(pattern, s_, idx)
        if torch.is_tensor(s_) and s_.ndim >= 1:
            s_ = block_rows(s_, query_dim=-1, key_dim=None)
        width = pattern.shape[-1]
        if idx is not None and int(idx.max()) >= width:  # a block that ends before a sink
            pattern = torch.nn.functional.pad(pattern, (0, int(idx.max()) + 1 - width))
        return set_sink_rate(pattern, s_, idx, query_start=block.query_start)[..., :width]

    set_sink_rate_hook.cwlens_blockwise = True  # type: ignore[attr-defined]
    return set_sink_rate_hook


def value_scale_hook(scale: float, position_index: torch.Tensor, kv_heads=None):
    """A ``hook_v`` hook scaling the value of position ``position_index[b]`` by ``scale``.

    ``kv_heads``: optional list of kv heads to scale (default: all heads of the layer).
    """

    def scale_value_hook(v: torch.Tensor, hook=None) -> torch.Tensor:
        return scale_position(v, position_index.to(v.device), scale, kv_heads)

    return scale_value_hook


@takes_model
def sink_rate_hooks(
    model: ModelLike, s, sink_index: torch.Tensor | None = None, layers: Layers = None
) -> list[Hook]:
    """``fwd_hooks`` setting the sink rate to ``s`` in ``layers`` (default: all).

    ``s`` may be a dict ``{layer: s}`` (e.g. each layer's own per-query rates).
    """
    resolved, _ = resolve_requested_layers(model.n_layers, layers)
    return [
        (hook_names.pattern(ly), sink_rate_hook(s[ly] if isinstance(s, dict) else s, sink_index))
        for ly in resolved
    ]


@takes_model
def sink_value_hooks(
    model: ModelLike, scale: float, position_index: torch.Tensor, layers: Layers = None,
    kv_heads=None,
) -> list[Hook]:
    """``fwd_hooks`` scaling the value at ``position_index`` in ``layers`` (default: all)."""
    resolved, _ = resolve_requested_layers(model.n_layers, layers)
    return [
        (hook_names.values(ly), value_scale_hook(scale, position_index, kv_heads))
        for ly in resolved
    ]


#: Run a block with the sink hooks added: :func:`~cwlens.engine.interventions.value_masking.hooks_applied`
#: (each hook point checked, the edits checked once per model to act, the hooks removed on
#: exit even when the block raises; yields the TransformerLens model).
applied = hooks_applied


def n_hooks(handle: ModelHandle) -> int:
    """How many forward hooks are attached to the model's hook points (0 when clean)."""
    return handle.n_hooks()
