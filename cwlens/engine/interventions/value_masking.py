"""Value masking: remove chosen terms ``a_ij^h v~_j^h`` from the attention heads' outputs.

A head writes ``o_i^h = sum_j a_ij^h v~_j^h`` (see :mod:`cwlens.core.geometry`). Masking
the entry ``(layer, head h, query i, key j)`` removes the projected value of key ``j`` from
what head ``h`` writes at query ``i``. It is done on ``blocks.{l}.attn.hook_pattern``:

    renormalize=False (default)   a'_ij = a_ij * (1 - m_ij)
        the removed mass is *not* given back to the other keys: the output loses exactly
        the masked terms, which is what the contribution weights attribute.
    renormalize=True              a'_ij = a_ij * (1 - m_ij) * s_i / s'_i
        (s_i, s'_i: row sums before and after; a row masked entirely stays 0). An
        ablation: the other keys absorb the mass, as if the key had never been there.

Masks are bool tensors ``[batch, head_index, query_pos, key_pos]`` (True = remove), one per
layer, shaped like the pattern of the batch being run. Hooks are built by small named
factories and are applied in :func:`hooks_applied`, which removes exactly the hooks it
added on exit, also when the forward pass raises.
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch

from cwlens.core._types import Pattern
from cwlens.core.bitmask import PackedMask
from cwlens.engine import hook_names, native
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.interventions.selfcheck import ensure_edits_act, kinds_of
from cwlens.engine.models.blockwise import block_rows, current_block
from cwlens.engine.streaming import attention_context
from cwlens.errors import MissingHookError, ShapeMismatchError

HookFn = Callable[..., torch.Tensor]
Masks = Mapping[int, "torch.Tensor | PackedMask"]  # PackedMask: unpacked only while its layer runs


def pattern_mask_hook(mask: "torch.Tensor | PackedMask", renormalize: bool = False) -> HookFn:
    """A ``hook_pattern`` hook that removes the entries where ``mask`` is True.

    Args:
        mask: bool ``[batch, head_index, query_pos, key_pos]`` (True = remove ``a_ij v~_j``);
            any shape that broadcasts to the pattern's is accepted (e.g. ``[1, head, q, k]``).
            A :class:`~cwlens.core.bitmask.PackedMask` is unpacked only while its layer runs.
        renormalize: rescale each row so that its sum is unchanged (default False: the
            masked terms are simply removed from the output).
    """

    def mask_pattern(pattern: Pattern, hook) -> Pattern:
        block = current_block()  # blockwise attention: this block's rows of the mask
        if isinstance(mask, PackedMask) and not renormalize:
            fast = _zero_packed(pattern, mask, block)
            if fast is not None:
                return fast
        if isinstance(mask, PackedMask) and block is not None:  # unpack the block's rows only
            keep_mask = ~mask.unpack_rows(block.query_start, block.n_rows)[..., : block.key_stop]
        else:
            keep_mask = ~block_rows(mask.unpack() if isinstance(mask, PackedMask) else mask.bool())
        try:
            keep = torch.broadcast_shapes(keep_mask.shape, pattern.shape) == pattern.shape
        except RuntimeError:
            keep = False
        if not keep:
            raise ShapeMismatchError(
                f"{getattr(hook, 'name', 'hook_pattern')}: the mask is {tuple(keep_mask.shape)} "
                f"but the pattern is {tuple(pattern.shape)} [batch, head, query, key]. Build "
                "masks from the clean run of this same batch (same tokens and padding)."
            )
        return remove_entries(pattern, keep_mask, renormalize)

    mask_pattern.cwlens_blockwise = True  # type: ignore[attr-defined]  # takes query blocks
    return mask_pattern


def _zero_packed(pattern: Pattern, mask: PackedMask, block) -> Pattern | None:
    """``pattern`` with ``mask``'s entries set to 0 by :func:`cwlens.engine.native.zero_masked`
    (one pass, the mask never unpacked; the same values as :func:`remove_entries`, the
    pattern being finite and >= 0), or None where it does not apply: not built, not a
    float32 CPU pattern, a mask that broadcasts instead of matching the pattern."""
    if pattern.dtype != torch.float32 or pattern.device.type != "cpu":
        return None

    if not native.available():
        return None
    bits = mask.bits
    width = mask.shape[-1]
    if block is not None:
        bits, width = bits.narrow(-2, block.query_start, block.n_rows), block.key_stop
    if tuple(pattern.shape) != (*bits.shape[:-1], width) or bits.device.type != "cpu":
        return None
    return native.zero_masked(pattern, bits)


def remove_entries(pattern: Pattern, keep_mask: torch.Tensor, renormalize: bool = False) -> Pattern:
    """``pattern`` with the entries where ``keep_mask`` is False set to 0 (and with
    ``renormalize`` each row rescaled to its old sum; a row masked entirely stays 0)."""
    kept = pattern * keep_mask.to(device=pattern.device, dtype=pattern.dtype)
    if not renormalize:
        return kept
    before = pattern.sum(-1, keepdim=True)
    after = kept.sum(-1, keepdim=True)
    scale = torch.where(after > 0, before / torch.where(after > 0, after, 1.0), 0.0)
    return kept * scale


def masking_hooks(masks: Masks, renormalize: bool = False) -> list[tuple[str, HookFn]]:
    """``[(hook name, hook)]`` removing ``masks[layer]`` in each layer (for ``run_with_hooks``)."""
    return [
        (hook_names.pattern(layer), pattern_mask_hook(mask, renormalize))
        for layer, mask in sorted(masks.items())
    ]


@contextmanager
@takes_model
def hooks_applied(model: ModelLike, fwd_hooks: Sequence[tuple[str, HookFn]]) -> Iterator[object]:
    """Add forward hooks to ``model`` for the duration of the block, then remove them.

    Only the hooks added here are removed (others, e.g. permanent ones, are left alone),
    and they are removed even if the block raises. Edits of ``hook_pattern``/``hook_v`` are
    first checked to act on this model (:func:`~cwlens.engine.interventions.selfcheck.ensure_edits_act`,
    once per model). Yields the TransformerLens model (given the model or its handle).
    """
    for name, _ in fwd_hooks:
        if not model.has_hook(name):
            raise MissingHookError(
                f"The model has no hook point {name!r}; the edit needs it in every layer it "
                f"changes (layers 0..{model.n_layers - 1})."
            )
    ensure_edits_act(model, kinds_of(name for name, _ in fwd_hooks))  # once per model and kind
    with model.hooks(fwd_hooks):  # TransformerLens removes exactly these on exit
        yield model.model  # the TransformerLens model, hooked


@contextmanager
def value_masking(model, masks: Masks, renormalize: bool = False) -> Iterator[object]:
    """Context manager: every forward pass inside runs with ``masks`` removed.

    ``masks``: ``{layer: bool [batch, head_index, query_pos, key_pos]}``; all layers are
    masked at once. See the module docstring for ``renormalize``. Yields the TransformerLens
    model (given the model or its handle).
    """
    with hooks_applied(model, masking_hooks(masks, renormalize)) as m:
        yield m


@takes_model
def run_masked(
    model: ModelLike,
    tokens: torch.Tensor,
    masks: Masks,
    renormalize: bool = False,
    attention_mask: torch.Tensor | None = None,
    attention: str = "auto",
    **kwargs,
) -> torch.Tensor:
    """Logits of ``model(tokens)`` with the masked terms removed (no gradients).

    ``attention``: ``"eager"``, ``"blockwise"`` (the masks act on each query block's
    probabilities before the value product) or ``"auto"`` (blockwise on long inputs),
    as in :func:`cwlens.stream_geometry`."""
    if attention_mask is not None:
        kwargs["attention_mask"] = attention_mask
    with torch.no_grad(), value_masking(model, masks, renormalize), \
            attention_context(model, tokens, attention):
        return model(tokens, **kwargs)
