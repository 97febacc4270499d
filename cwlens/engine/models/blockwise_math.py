"""The arithmetic of blockwise attention (:mod:`cwlens.engine.models.blockwise`):
``softmax(q k^T * scale + mask) v`` one block of query rows at a time (:func:`attend`), the
masks evaluated per block (:class:`LazyMask`: Hugging Face's ``sdpa_mask`` arguments, never
the ``[batch, 1, n, n]`` tensor), and where the rows of the current block sit
(:func:`current_block`, :func:`block_rows`) for the hooks that read ``hook_pattern``.
Tensors in, tensors out: the bridge's attention modules are patched in ``blockwise``.
"""

import contextvars
from dataclasses import dataclass
from typing import Any

import torch

DEFAULT_BLOCK = 256


@dataclass(frozen=True)
class Block:
    """Where the rows handed to ``hook_pattern`` sit: queries ``[query_start,
    query_start + n_rows)`` of ``n_queries``, keys ``[0, key_stop)`` of ``n_keys``.

    Blocks come widest (last queries) first; ``last`` marks the layer's final block (the
    one at ``query_start`` 0), after which a consumer may close the layer."""

    query_start: int
    n_rows: int
    key_stop: int
    n_queries: int
    n_keys: int
    last: bool = True


_CURRENT: contextvars.ContextVar[Block | None] = contextvars.ContextVar("cwlens_block", default=None)


_OFFERED: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("cwlens_block_output", default=None)


def offer_output(rows: torch.Tensor, output: torch.Tensor) -> None:
    """Called by a reader of ``hook_pattern`` that computed the block's value product
    ``rows @ v`` itself (``[batch, head, n_rows, d_v]``, in the rows' dtype, from the rows
    exactly as it was handed them and the layer's ``hook_v``): :func:`attend` uses it
    instead of computing it again, if the rows come back from the hooks unedited (the
    same storage, shape and version: an in-place edit after the offer voids it)."""
    _OFFERED.set((rows.data_ptr(), rows._version, tuple(rows.shape), rows.dtype, output))


def _offered(alpha: torch.Tensor, shape: tuple) -> torch.Tensor | None:
    """The offered value product of ``alpha``'s block, where it is still valid."""
    offer = _OFFERED.get()
    if offer is None:
        return None
    ptr, version, rows_shape, dtype, output = offer
    if (ptr, version, rows_shape, dtype) != (alpha.data_ptr(), alpha._version, tuple(alpha.shape), alpha.dtype):
        return None
    if tuple(output.shape) != shape or output.dtype != alpha.dtype or output.device != alpha.device:
        return None
    return output


def current_block() -> Block | None:
    """The block ``hook_pattern`` is firing for, or None in an eager (whole-layer) run."""
    return _CURRENT.get()


def block_rows(tensor: torch.Tensor, query_dim: int = -2, key_dim: int | None = -1) -> torch.Tensor:
    """``tensor`` (shaped like a whole layer's pattern, or broadcastable to it) cut to the
    current block's rows (and keys, if ``key_dim``); unchanged outside a blockwise run.
    Size-1 axes (broadcast) are kept."""
    block = current_block()
    if block is None:
        return tensor
    if tensor.shape[query_dim] != 1:
        tensor = tensor.narrow(query_dim, block.query_start, block.n_rows)
    if key_dim is not None and tensor.shape[key_dim] != 1:
        tensor = tensor.narrow(key_dim, 0, block.key_stop)
    return tensor


# -- masks: Hugging Face's mask function, evaluated per block ------------------------------
class LazyMask:
    """What the model's mask creation returns under blockwise attention
    (:data:`~cwlens.engine.models.blockwise.ATTN_IMPLEMENTATION`): the arguments of
    ``transformers.masking_utils.sdpa_mask``, evaluated for one block of query rows at a
    time (:meth:`rows`) instead of as one ``[batch, 1, n, n]`` tensor."""

    ndim = 4

    def __init__(self, batch_size, q_length, kv_length, **sdpa_args):
        # the keywords of transformers.masking_utils.sdpa_mask that matter here
        self.batch_size, self.q_length, self.kv_length = batch_size, q_length, kv_length
        self.q_offset = sdpa_args.get("q_offset", 0)
        self.kv_offset = sdpa_args.get("kv_offset", 0)
        self.mask_function: Any = sdpa_args.get("mask_function")
        self.attention_mask = sdpa_args.get("attention_mask")
        self.use_vmap = sdpa_args.get("use_vmap", False)
        self.device = sdpa_args.get("device", "cpu")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch_size, 1, self.q_length, self.kv_length)

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """bool ``[batch or 1, 1, stop - start, kv_length]``: True where a query sees a key."""
        from transformers.masking_utils import sdpa_mask  # heavy: transformers, imported on use

        mask = sdpa_mask(
            batch_size=self.batch_size, q_length=stop - start, kv_length=self.kv_length,
            q_offset=self.q_offset + start, kv_offset=self.kv_offset,
            mask_function=self.mask_function, attention_mask=self.attention_mask,
            allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
            use_vmap=self.use_vmap, device=self.device,
        )
        if mask is None:  # no skipping was allowed, so sdpa_mask always builds one
            return torch.ones(1, 1, stop - start, self.kv_length, dtype=torch.bool, device=self.device)
        return mask


def lazy_mask(**kwargs) -> LazyMask:
    """The mask function registered for blockwise attention: a :class:`LazyMask`."""
    return LazyMask(**kwargs)


def _visible(mask, start: int, stop: int, n_keys: int, causal: bool, device) -> torch.Tensor:
    """bool ``[batch or 1, 1, rows, n_keys]`` of the keys each query of the block sees."""
    if isinstance(mask, LazyMask):
        return mask.rows(start, stop)[..., :n_keys]
    if mask is None:
        if not causal:
            return torch.ones(1, 1, stop - start, n_keys, dtype=torch.bool, device=device)
        q = torch.arange(start, stop, device=device)[:, None]  # no cache: query i is key i
        return (torch.arange(n_keys, device=device)[None, :] <= q)[None, None]
    rows = mask[..., start:stop, :n_keys]  # a 4-D mask someone built already
    if rows.dtype == torch.bool:
        return rows
    return rows > torch.finfo(rows.dtype).min / 2


# -- the computation ---------------------------------------------------------------------
@dataclass(frozen=True)
class Softmax:
    """How one layer's :func:`attend` computes its weights (the model's own choices).

    ``causal``: queries see keys ``<= i`` (beyond what ``mask`` says); ``pattern_hook``: a
    ``hook_pattern`` to route each block's probabilities through (None: SDPA, nothing
    exposed); ``softcap``: Gemma-2's logit soft-capping; ``upcast``: softmax in float32;
    ``compatibility``: TransformerLens compatibility mode (masked scores -inf); ``block``:
    query rows per block; ``sdpa_block``: query rows per block of a layer that runs SDPA
    (no ``pattern_hook``, no ``softcap``), where no probabilities are materialised here."""

    causal: bool
    pattern_hook: Any = None
    softcap: float | None = None
    upcast: bool = True
    compatibility: bool = False
    block: int = DEFAULT_BLOCK
    sdpa_block: int | None = None  # rows per block where SDPA runs (no pattern hook): None = block


def attend(q, k, v, scaling: float, mask, how: Softmax) -> torch.Tensor:
    """``softmax(q k^T * scaling + mask) v`` in query blocks: ``[batch, head, n, d_v]``.

    ``q [batch, head, n, d]``, ``k``/``v [batch, kv_head, n_keys, d]`` (kv heads not
    repeated: head ``h`` reads kv head ``h // (head / kv_head)``). ``pattern_hook``: a
    ``hook_pattern`` to route each block's probabilities through (None: SDPA, nothing
    exposed). A row that sees no key gets what eager attention gives it (the mean of all
    values; 0 in TransformerLens compatibility mode).
    """
    causal, pattern_hook, softcap = how.causal, how.pattern_hook, how.softcap
    upcast, compatibility, block = how.upcast, how.compatibility, how.block
    if pattern_hook is None and softcap is None and how.sdpa_block:
        block = how.sdpa_block  # SDPA holds no [batch, head, rows, n] block of ours
    b, h, n, d = q.shape
    n_kv, n_keys = k.shape[1], k.shape[2]
    group = h // n_kv
    out = q.new_empty(b, h, n, v.shape[-1])
    min_value = -torch.inf if compatibility else torch.finfo(q.dtype).min
    mean_v = None
    # widest (last) block first: a causal block's width grows with its start, so in this
    # order each block fits in memory its predecessor freed instead of growing the heap
    for start in reversed(range(0, n, block)):
        stop = min(n, start + block)
        rows = stop - start
        seen = _visible(mask, start, stop, n_keys, causal, q.device)  # [b|1, 1, rows, n_keys]
        cols = seen.any(-2).any(0)[0].nonzero()  # keys some row of the block sees
        if cols.numel() == 0:
            k0 = k1 = 0
        else:
            k0, k1 = int(cols[0]), int(cols[-1]) + 1
        if pattern_hook is not None:
            k0 = 0  # hook_pattern gets keys 0 .. key_stop - 1
        empty = ~seen.any(-1)  # [b|1, 1, rows]: rows that see no key at all
        seen = seen[..., k0:k1]
        qb = q[:, :, start:stop]
        kb, vb = k[:, :, k0:k1], v[:, :, k0:k1]
        if pattern_hook is None and softcap is None and k1 > k0:
            o = torch.nn.functional.scaled_dot_product_attention(
                qb, kb, vb, attn_mask=seen, scale=scaling, enable_gqa=group > 1)
        elif k1 > k0:
            scores = torch.matmul(qb.reshape(b, n_kv, group * rows, d), kb.transpose(-1, -2))
            scores = scores.view(b, h, rows, k1 - k0) * scaling
            if softcap is not None:
                scores = torch.tanh(scores / softcap) * softcap
            scores = scores.masked_fill(~seen, min_value)
            if compatibility:
                scores = scores.masked_fill(empty[..., None], 0.0)
            alpha = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32 if upcast else None)
            alpha = alpha.to(q.dtype)
            del scores
            if compatibility:
                alpha = alpha.masked_fill(empty[..., None], 0.0)
            offered: torch.Tensor | None = None
            if pattern_hook is not None:
                token = _CURRENT.set(Block(start, rows, k1, n, n_keys, last=start == 0))
                offer = _OFFERED.set(None)
                try:
                    alpha = pattern_hook(alpha)
                    offered = _offered(alpha, (b, h, rows, v.shape[-1]))  # a reader's alpha v
                finally:
                    _OFFERED.reset(offer)
                    _CURRENT.reset(token)
            if offered is None:
                o = torch.matmul(alpha.reshape(b, n_kv, group * rows, k1 - k0), vb).view(b, h, rows, v.shape[-1])
            else:
                o = offered
            del alpha, offered
        else:
            o = q.new_zeros(b, h, rows, v.shape[-1])
        if bool(empty.any()):
            if compatibility:
                fill = torch.zeros((), dtype=o.dtype, device=o.device)
            else:
                if mean_v is None:  # eager: a row of equal scores averages every value
                    mean_v = v.float().mean(2).repeat_interleave(group, 1).to(v.dtype)[:, :, None]
                fill = mean_v
            o = torch.where(empty[..., None].expand(b, h, rows, 1), fill, o)
        out[:, :, start:stop] = o
        del o, seen
    return out
