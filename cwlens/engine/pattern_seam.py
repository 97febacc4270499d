"""Make ``hook_pattern`` edits act on TransformerBridge models that delegate attention.

TransformerLens 4.x wraps some attentions (BERT's among them) whole: the Hugging Face
module computes ``softmax(q k^T * scale + mask) @ v`` itself and the bridge fires
``hook_pattern`` afterwards, on the weights the module returned. An edit made there
changes nothing (TransformerLens warns and discards it), so value masking and the
sink-rate intervention would silently be no-ops.

The bridge has a seam for this: a wrapped module that declares ``accepts_pattern_fn``
gets the bridge's ``hook_pattern`` as a ``pattern_fn`` keyword, and applies it *before*
the value product. Hugging Face attention modules pass unknown keywords down to their
attention function, so :func:`enable_pattern_edits` registers one more attention
function with ``transformers.AttentionInterface`` -- the eager one, same math::

    A = softmax(q k^T * scaling + mask);  A' = pattern_fn(A);  out = A' v

-- selects it on the wrapped model and marks the delegating attention modules. The
model's function is unchanged (A' = A without hooks); ``hook_pattern`` then fires once,
inside the computation, so caches see the pattern the heads actually used.
"""

import torch

ATTN_IMPLEMENTATION = "cwlens_eager_pattern"


def eager_with_pattern_fn(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, pattern_fn=None,
    **kwargs,
):
    """Hugging Face's eager attention with ``pattern_fn`` applied to the probabilities.

    ``query [batch, head, q, d]``, ``key``/``value [batch, kv_head, k, d]``; returns
    ``(out [batch, q, head, d], pattern [batch, head, q, k])`` as the eager function does.
    """
    if key.shape[1] != query.shape[1]:  # grouped-query attention: repeat the kv heads
        groups = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[..., : key.shape[-2]]
    pattern = torch.nn.functional.softmax(scores, dim=-1)
    pattern = torch.nn.functional.dropout(pattern, p=dropout, training=module.training)
    if pattern_fn is not None:
        pattern = pattern_fn(pattern)
    out = torch.matmul(pattern, value).transpose(1, 2).contiguous()
    return out, pattern


def _register() -> None:
    from transformers import AttentionInterface  # heavy: transformers, imported on use
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    if ATTN_IMPLEMENTATION not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTN_IMPLEMENTATION, eager_with_pattern_fn)
    if ATTN_IMPLEMENTATION not in AttentionMaskInterface._global_mapping:  # additive masks
        AttentionMaskInterface.register(ATTN_IMPLEMENTATION, ALL_MASK_ATTENTION_FUNCTIONS["eager"])


def enable_pattern_edits(model) -> bool:
    """Route ``hook_pattern`` through the attention computation; True if anything changed.

    Idempotent and cheap (no forward pass). Models that already hook the pattern inside
    (HookedTransformer, HookedEncoder, bridges that reimplement attention) are untouched.
    The attentions changed are those that hand the whole computation to the Hugging Face
    module: plain ``AttentionBridge`` instances (subclasses reimplement the attention and
    fire ``hook_pattern`` inside it already) whose module has no ``pattern_fn`` seam yet.
    """
    try:
        # heavy: transformer_lens, imported on use
        from transformer_lens.model_bridge.generalized_components.attention import (
            AttentionBridge,
        )
    except ImportError:  # TransformerLens 3.x: HookedTransformer/HookedEncoder hook inside
        return False
    attns = [block.attn for block in getattr(model, "blocks", [])
             if getattr(type(getattr(block, "attn", None)), "forward", None) is AttentionBridge.forward
             and getattr(block.attn, "original_component", None) is not None
             and not getattr(block.attn.original_component, "accepts_pattern_fn", False)]
    hf = getattr(model, "original_model", None)
    if not attns or hf is None:
        return False
    _register()
    hf.config._attn_implementation = ATTN_IMPLEMENTATION
    for sub in hf.modules():  # sub-configs (if any) of nested models
        cfg = getattr(sub, "config", None)
        if cfg is not None and getattr(cfg, "_attn_implementation", None) == "eager":
            cfg._attn_implementation = ATTN_IMPLEMENTATION
    for attn in attns:
        attn.original_component.accepts_pattern_fn = True
    return True
