"""Blockwise attention: the model's ``softmax(q k^T * scale + mask) v``, query block by
query block, so no ``[batch, head, n, n]`` tensor ever exists.

Inside :func:`blockwise_attention` each attention layer of a TransformerLens 4.x bridge
computes its scores for ``block`` queries at a time:

- causal blocks stop at their last query's key, sliding windows skip keys outside the
  window, padding and every other mask come from Hugging Face's own mask function
  (evaluated per block: the 4-D ``[batch, 1, n, n]`` mask is never built either);
- the same math as the bridge's eager attention (scores in the model's dtype, softmax in
  float32, softcapping, GQA groups, rows without any visible key), so logits equal the
  eager forward's up to float rounding;
- where ``hook_pattern`` has hooks (a cwlens measure or intervention needs the layer),
  each block's probabilities ``alpha`` ``[batch, head, block, key_stop]`` (keys
  ``0 .. key_stop - 1``; for causal layers ``key_stop`` is the block's last query + 1)
  go through ``hook_pattern`` before the value product, so edits act and readers see the
  rows the heads used; the block is freed afterwards. Elsewhere the block runs on
  ``torch.nn.functional.scaled_dot_product_attention``.

Hooks on ``hook_q``, ``hook_k``, ``hook_v``, ``hook_z``, ``hook_attn_out`` and the residual
stream fire with full tensors as usual. ``hook_pattern`` fires once per block: only hooks
that know this (functions with ``cwlens_blockwise = True``, which read the block's place
from :func:`current_block`) are allowed there; any other hook on ``hook_pattern`` or
``hook_attn_scores`` raises :class:`~cwlens.errors.BlockwiseHookError` (see
``docs/long_context.md``).

Supported: the bridge's ``PositionEmbeddingsAttentionBridge`` (Llama, Mistral, Qwen2/3,
Gemma-3, ...), ``JointQKVAttentionBridge`` (GPT-2) and delegating ``AttentionBridge``
modules that take Hugging Face attention functions (BERT). TransformerLens 3.x's
``HookedTransformer`` computes attention in its own code with no seam: blockwise raises
:class:`~cwlens.errors.UnsupportedModelError` there.
"""

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from cwlens.engine.handle import ModelHandle

# the arithmetic, per block; block_rows and current_block are re-exported (the adapter's)
from cwlens.engine.models.blockwise_math import (  # noqa: F401
    DEFAULT_BLOCK,
    Softmax,
    attend,
    block_rows,
    current_block,
    lazy_mask,
    offer_output,
)
from cwlens.engine.pattern_seam import eager_with_pattern_fn, enable_pattern_edits
from cwlens.errors import BlockwiseHookError, UnsupportedModelError

ATTN_IMPLEMENTATION = "cwlens_blockwise"
AUTO_THRESHOLD = 2048  # attention="auto" runs blockwise above this many tokens


# -- the hooks: only blockwise-aware readers on hook_pattern -----------------------------
def hook_fns(hook_point) -> list:
    """The user functions registered on a TransformerLens ``HookPoint`` (forward hooks)."""
    fns = []
    for fn in list(getattr(hook_point, "_forward_hooks", {}).values()):
        inner = fn
        names = getattr(getattr(fn, "__code__", None), "co_freevars", ())
        if "hook" in names and fn.__closure__ is not None:
            inner = fn.__closure__[names.index("hook")].cell_contents
        fns.append(inner)
    return fns


def _check_hooks(attn, name: str) -> bool:
    """True if ``hook_pattern`` has (blockwise-aware) hooks; raise on any other hook there
    or on ``hook_attn_scores``."""
    for point in ("hook_attn_scores", "hook_pattern"):
        hp = getattr(attn, point, None)
        if hp is None:
            continue
        for fn in hook_fns(hp):
            if point == "hook_pattern" and getattr(fn, "cwlens_blockwise", False):
                continue
            raise BlockwiseHookError(
                f"{name}.{point} has a hook ({getattr(fn, '__name__', fn)!r}) but attention runs "
                f"blockwise here (attention='blockwise', or 'auto' above "
                f"{AUTO_THRESHOLD} tokens), where no [batch, head, n, n] tensor exists for it "
                "to see. Run with attention='eager', or read the weights through "
                "cwlens.stream_reduce reducers (see docs/long_context.md)."
            )
    hp = getattr(attn, "hook_pattern", None)
    return hp is not None and bool(getattr(hp, "_forward_hooks", None))


# -- the three bridge attention shapes ---------------------------------------------------
def _refuse(attn, what: str):
    raise UnsupportedModelError(
        f"{getattr(attn, 'name', type(attn).__name__)}: blockwise attention does not support "
        f"{what}. Run with attention='eager'."
    )


def _position_embeddings_forward(attn, state: "_State"):
    """A standard-path copy of ``PositionEmbeddingsAttentionBridge.forward`` with the
    attention itself done by :func:`attend` (every hook before and after it fires)."""

    def forward(*args: Any, **kwargs: Any):
        hf_attn: Any = attn.original_component
        cfg = attn.config
        hidden_states = kwargs.pop("hidden_states") if "hidden_states" in kwargs else args[0]
        position_embeddings = kwargs.pop("position_embeddings", None)
        attention_mask = kwargs.pop("attention_mask", None)
        for flag in ("use_split_qkv_input", "use_attn_in", "gated_q_proj", "use_attn_result",
                     "qk_norm_after_rope", "rotary_interleaved_cos_sin", "rotary_adjacent_pairs"):
            if getattr(cfg, flag, False):
                _refuse(attn, f"config.{flag}")
        for extra in ("key_multiplier", "sinks"):
            if getattr(hf_attn, extra, None) is not None:
                _refuse(attn, f"attention {extra}")
        if getattr(getattr(hf_attn, "config", None), "clip_qkv", None) is not None:
            _refuse(attn, "clip_qkv")
        if attn._modules.get("gate") is not None:
            _refuse(attn, "gated attention")
        if attn.training and getattr(hf_attn, "attention_dropout", 0.0) > 0:
            _refuse(attn, "attention dropout in training mode")
        hidden_states = attn.hook_in(hidden_states)
        input_shape = hidden_states.shape[:-1]
        head_dim = hf_attn.head_dim
        hidden_shape = (*input_shape, -1, head_dim)
        query = attn.q(hidden_states)
        key = attn.k(hidden_states)
        value = attn.v(hidden_states)
        has_q_norm, has_k_norm = "q_norm" in attn.submodules, "k_norm" in attn.submodules
        phase = attn._qk_norm_phase
        if has_q_norm and phase == "pre_reshape":
            query = attn._apply_pre_reshape_qk_norm(query, attn.q_norm, attn.hook_q_normed, head_dim)
            if has_k_norm:
                key = attn._apply_pre_reshape_qk_norm(key, attn.k_norm, attn.hook_k_normed, head_dim)
        query = query.view(hidden_shape).transpose(1, 2)
        key = key.view(hidden_shape).transpose(1, 2)
        value = value.view(hidden_shape).transpose(1, 2)
        if has_q_norm and phase == "post_reshape":
            if attn._qk_norm_per_head:
                query = attn.hook_q_normed(attn.q_norm(query.transpose(1, 2)).transpose(1, 2))
                if has_k_norm:
                    key = attn.hook_k_normed(attn.k_norm(key.transpose(1, 2)).transpose(1, 2))
            else:
                query = attn.hook_q_normed(attn.q_norm(query))
                if has_k_norm:
                    key = attn.hook_k_normed(attn.k_norm(key))
        if position_embeddings is not None:
            # heavy: transformers, imported on use
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

            cos, sin = attn._apply_position_embedding_hooks(position_embeddings)
            if cos.shape[-1] != head_dim:
                _refuse(attn, "partial or half-width rotary embeddings")
            query, key = apply_rotary_pos_emb(query, key, cos, sin)
        rope = getattr(getattr(hf_attn, "config", None), "rope_parameters", None)
        if isinstance(rope, dict) and rope.get("llama_4_scaling_beta") is not None:
            _refuse(attn, "llama-4 query scaling")
        if hasattr(attn, "hook_rot_q"):
            query = attn.hook_rot_q(query)
        if hasattr(attn, "hook_rot_k"):
            key = attn.hook_rot_k(key)
        key, value = attn._update_kv_cache(key, value, **kwargs)
        if key.shape[-2] != query.shape[-2]:
            _refuse(attn, "a KV cache (generation)")
        out = attend(
            query, key, value, getattr(hf_attn, "scaling", head_dim ** -0.5), attention_mask,
            Softmax(causal=attn.is_causal,
                    pattern_hook=attn.hook_pattern if state.wants(attn) else None,
                    softcap=getattr(hf_attn, "attn_logit_softcapping", None),
                    compatibility=attn.compatibility_mode, block=state.block,
                    sdpa_block=state.sdpa_block),
        )
        out = out.transpose(1, 2).reshape(*input_shape, -1)
        out = attn._pre_output_projection(out)
        o_weight = getattr(getattr(getattr(attn, "o", None), "original_component", None), "weight", None)
        if isinstance(o_weight, torch.Tensor) and o_weight.dtype.is_floating_point and out.dtype != o_weight.dtype:
            out = out.to(o_weight.dtype)
        out = attn.hook_out(attn.o(out))
        return out, None

    return forward


def _joint_qkv_reconstruct(attn, state: "_State"):
    """``JointQKVAttentionBridge._reconstruct_attention`` (GPT-2) with :func:`attend`."""

    def reconstruct(q, k, v, **kwargs):
        cfg = attn.config
        if getattr(cfg, "use_attn_result", False):
            _refuse(attn, "config.use_attn_result")
        n_heads = cfg.n_heads
        n_kv = getattr(cfg, "n_key_value_heads", None) or n_heads
        q, k, v, batch, seq, head_dim = attn._reshape_qkv_to_heads(q, k, v, n_heads, n_kv)
        k, v = attn._update_kv_cache(k, v, **kwargs)
        if k.shape[-2] != seq:
            _refuse(attn, "a KV cache (generation)")
        if attn.training and getattr(attn.original_component, "attn_dropout", None) is not None \
                and attn.original_component.attn_dropout.p > 0:
            _refuse(attn, "attention dropout in training mode")
        scale = head_dim ** -0.5
        if getattr(cfg, "scale_attn_by_inverse_layer_idx", False) and attn._layer_idx is not None:
            scale /= float(attn._layer_idx + 1)
        upcast = bool(getattr(attn, "_reorder_and_upcast_attn", False))
        if upcast:
            q, k = q.float(), k.float()
        out = attend(q, k, v.to(q.dtype), scale, kwargs.get("attention_mask"),
                     Softmax(causal=attn.is_causal,
                             pattern_hook=attn.hook_pattern if state.wants(attn) else None,
                             upcast=False, compatibility=attn.compatibility_mode, block=state.block,
                             sdpa_block=state.sdpa_block))
        out = attn._reshape_attn_output(out.to(v.dtype), batch, seq, n_heads, head_dim)
        return attn._apply_output_projection(out), None

    return reconstruct


def _hf_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                  pattern_fn=None, **kwargs):
    """A Hugging Face attention function (delegating bridges: BERT) running :func:`attend`."""
    state = _ACTIVE.get()
    if state is None:  # outside blockwise_attention: plain eager with the pattern seam
        return eager_with_pattern_fn(module, query, key, value, attention_mask, scaling, dropout,
                                     pattern_fn, **kwargs)
    if module.training and dropout > 0:
        _refuse(module, "attention dropout in training mode")
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    hook = pattern_fn if pattern_fn is not None and state.wants_hook(pattern_fn) else None
    causal = bool(getattr(module, "is_causal", False))
    out = attend(query, key, value, scaling, attention_mask,
                 Softmax(causal=causal, pattern_hook=hook, block=state.block,
                         sdpa_block=state.sdpa_block))
    return out.transpose(1, 2).contiguous(), None


_ACTIVE: contextvars.ContextVar["_State | None"] = contextvars.ContextVar("cwlens_blockwise", default=None)


class _State:
    def __init__(self, block: int, names: dict[int, str], sdpa_block: int | None = None):
        self.block, self.sdpa_block = block, sdpa_block
        self.names = names  # id(hook point or attention) -> name, for errors

    def wants(self, attn) -> bool:
        return _check_hooks(attn, self.names.get(id(attn), getattr(attn, "name", "attn")))

    def wants_hook(self, hook_point) -> bool:
        parent = _Parent(hook_point)
        return _check_hooks(parent, self.names.get(id(hook_point), "attn"))


class _Parent:
    def __init__(self, hook_point):
        self.hook_pattern = hook_point


def _register() -> None:
    from transformers import AttentionInterface  # heavy: transformers, imported on use
    from transformers.masking_utils import AttentionMaskInterface

    if ATTN_IMPLEMENTATION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN_IMPLEMENTATION, _hf_attention)
    if ATTN_IMPLEMENTATION not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, lazy_mask)


@contextmanager
def blockwise_attention(handle: ModelHandle, block: int = DEFAULT_BLOCK, sdpa_block: int | None = None
                        ) -> Iterator[None]:
    """Run every forward pass inside in query blocks of ``block`` rows (see the module
    docstring), and layers that run SDPA (nothing reads their probabilities) in blocks of
    ``sdpa_block`` rows (None: ``block``); the model is restored on exit, also when the
    forward raises."""
    # heavy: transformer_lens, imported on use
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge
    from transformer_lens.model_bridge.generalized_components.joint_qkv_attention import (
        JointQKVAttentionBridge,
    )
    from transformer_lens.model_bridge.generalized_components.position_embeddings_attention import (
        PositionEmbeddingsAttentionBridge,
    )

    if not handle.supports_blockwise:
        raise UnsupportedModelError(
            f"Blockwise attention needs a TransformerLens 4.x TransformerBridge; this is a "
            f"{handle.class_name} (TransformerLens 3.x computes attention in its own code, "
            "with no seam to run it in blocks). Use attention='eager', or load the model with "
            "TransformerLens 4.x (cwlens.load_model)."
        )
    model = handle.model
    _register()
    enable_pattern_edits(model)  # delegating attentions: hook_pattern inside the computation
    names: dict[int, str] = {}
    patched: list[tuple[Any, str]] = []
    delegating = False
    for i, blk in enumerate(model.blocks):
        attn = getattr(blk, "attn", None)
        if attn is None:
            continue
        names[id(attn)] = names[id(attn.hook_pattern)] = f"blocks.{i}.attn"
        if isinstance(attn, PositionEmbeddingsAttentionBridge) and \
                type(attn).forward is PositionEmbeddingsAttentionBridge.forward:
            patched.append((attn, "forward"))
        elif isinstance(attn, JointQKVAttentionBridge) and \
                type(attn)._reconstruct_attention is JointQKVAttentionBridge._reconstruct_attention:
            patched.append((attn, "_reconstruct_attention"))
        elif type(attn).forward is AttentionBridge.forward and \
                getattr(attn.original_component, "accepts_pattern_fn", False):
            delegating = True
        else:
            raise UnsupportedModelError(
                f"blocks.{i}.attn is a {type(attn).__name__}, whose attention cwlens cannot run "
                "blockwise. Use attention='eager'."
            )
    state = _State(block, names, sdpa_block)
    hf = model.original_model
    configs = [c for c in {id(c): c for c in [hf.config] + [getattr(m, "config", None) for m in hf.modules()]
                           if c is not None and hasattr(c, "_attn_implementation")}.values()]
    before = [(c, c._attn_implementation) for c in configs]
    token = _ACTIVE.set(state)
    try:
        for c in configs:
            c._attn_implementation = ATTN_IMPLEMENTATION
        for attn, what in patched:
            make = _position_embeddings_forward if what == "forward" else _joint_qkv_reconstruct
            object.__setattr__(attn, what, make(attn, state))  # the bridge forwards setattr
        del delegating
        yield
    finally:
        _ACTIVE.reset(token)
        for attn, what in patched:
            attn.__dict__.pop(what, None)
        for c, impl in before:
            c._attn_implementation = impl
