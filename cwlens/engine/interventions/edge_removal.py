"""Remove single attention edges ``a_ij^h v~_j^h`` from one query's head outputs, many
ablated copies of one input at a time, and read what each copy predicts there.

An *edit* subtracts ``delta = a_ij^h v_j^g`` (``d_head`` wide: ``v~ = v W_O``, so this is
the edge's term before the output projection) from ``hook_z`` of head ``h`` in layer
``l`` at the query position, in one *row* (one ablated copy of the input). A row may carry
several edits (the edges of a method's top k, removed together); every other head, key,
position and layer is untouched. :func:`ablated_outputs` runs the rows in chunks and
returns ``reduce(final residual logits at the query)`` per row.

Two ways to run a row, equal up to round-off (tested):

``"full"``
    the whole input, batched (one row per copy). Any model: encoders too, where every
    position changes after the edit.
``"prefix"``
    causal decoders on TransformerLens 4.x (``TransformerBridge``). In a causal model an
    edit at query ``i`` in layer ``l`` changes nothing before position ``i`` and nothing
    below layer ``l``, so a row carries only position ``i`` and only from layer ``l`` on:
    the clean keys and values of positions ``< i`` come from a Hugging Face cache of one
    clean run of the prefix, shared by every row without being copied, and the residual
    entering layer ``l`` is the clean one, repeated into the rows at ``hook_resid_pre``
    (the layers below run once, for one row). A chunk's rows all start at the same layer
    (:func:`layer_chunks`: a row's lowest edited layer). The rows travel as *positions* of
    one sequence, every one at the query's position id, each attending to the clean prefix
    (as the clean query sees it: sliding windows kept) and to itself only, by a 4-D mask set
    on each attention: the prefix's keys and values are then read once per chunk, not copied
    into every row (measured 2-3 times faster than rows in the batch on SmolLM2).
    TransformerLens 4.3's attention bridge reads the cache only under the keyword
    ``past_key_values``, which transformers 5 passes as ``cache``: a forward pre-hook on
    each attention renames it while the rows run (without it a cached step silently
    attends to itself alone).
"""

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from cwlens.engine import hook_names
from cwlens.engine.handle import ModelHandle
from cwlens.errors import InvalidArgumentError

Reduce = Callable[[torch.Tensor], torch.Tensor]  # logits [rows, d_vocab] -> [rows]


@dataclass(frozen=True)
class Edits:
    """Edits of ``n_rows`` ablated copies: entry ``e`` subtracts ``delta[e]`` from
    ``hook_z[row[e], query, head[e]]`` of layer ``layer[e]``. Rows without an entry are
    clean copies."""

    row: torch.Tensor  # [E] long
    layer: torch.Tensor  # [E] long
    head: torch.Tensor  # [E] long
    delta: torch.Tensor  # [E, d_head]
    n_rows: int

    def __post_init__(self) -> None:
        e = self.row.shape[0]
        if not (self.layer.shape == self.head.shape == (e,) and self.delta.ndim == 2
                and self.delta.shape[0] == e):
            raise InvalidArgumentError(
                f"edits need row, layer, head of one length E and delta [E, d_head]; got "
                f"{tuple(self.row.shape)}, {tuple(self.layer.shape)}, {tuple(self.head.shape)}, "
                f"{tuple(self.delta.shape)}")
        if e and (int(self.row.min()) < 0 or int(self.row.max()) >= self.n_rows):
            raise InvalidArgumentError(f"an edit's row is outside 0..{self.n_rows - 1}")

    def first_layer(self, n_layers: int) -> torch.Tensor:
        """``[n_rows]`` each row's lowest edited layer (``n_layers`` for a clean row)."""
        first = torch.full((self.n_rows,), n_layers, dtype=torch.long)
        return first.scatter_reduce(0, self.row.cpu(), self.layer.cpu(), "amin")

    def select(self, rows: torch.Tensor) -> "Edits":
        """The edits of ``rows`` (a 1-D long tensor of row ids), renumbered 0..len(rows)-1."""
        new_id = torch.full((self.n_rows,), -1, dtype=torch.long)
        new_id[rows] = torch.arange(len(rows))
        keep = new_id[self.row.cpu()] >= 0
        idx = keep.nonzero()[:, 0]
        return Edits(new_id[self.row.cpu()[idx]], self.layer.cpu()[idx], self.head.cpu()[idx],
                     self.delta[idx.to(self.delta.device)], len(rows))


def _z_hook(rows: torch.Tensor, heads: torch.Tensor, delta: torch.Tensor, position: int | None):
    """Subtract ``delta`` from ``hook_z[row, position, head]``; ``position=None``: the rows
    are the positions of one sequence (the prefix path), ``hook_z[0, row, head]``."""

    def remove_edges(z: torch.Tensor, hook) -> torch.Tensor:
        z = z.clone()
        r, h = rows.to(z.device), heads.to(z.device)
        if position is None:
            where = (torch.zeros_like(r), r, h)
        else:
            where = (r, torch.full_like(r, position if position >= 0 else z.shape[1] + position), h)
        z.index_put_(where, -delta.to(device=z.device, dtype=z.dtype), accumulate=True)
        return z

    return remove_edges


def z_hooks(edits: Edits, position: int | None) -> list[tuple[str, Any]]:
    """One ``hook_z`` hook per edited layer, subtracting the edits at ``position`` (None:
    each row's own position, the prefix path)."""
    hooks = []
    for layer in sorted(set(edits.layer.tolist())):
        at = (edits.layer == layer).nonzero()[:, 0]
        hooks.append((hook_names.z(layer),
                      _z_hook(edits.row[at], edits.head[at], edits.delta[at.to(edits.delta.device)],
                              position)))
    return hooks


def _chunks(order: torch.Tensor, size: int) -> Iterator[torch.Tensor]:
    for start in range(0, len(order), size):
        yield order[start:start + size]


def layer_chunks(first: torch.Tensor, size: int) -> Iterator[torch.Tensor]:
    """The row ids, deepest first layer first, in chunks of at most ``size`` rows that never
    mix first layers (a chunk runs from its lowest first layer: a mixed chunk would run its
    deeper rows through layers where they are clean), each layer's rows split into equal
    parts (576 rows at ``size=512`` are two chunks of 288, not 512 and 64)."""
    for layer in torch.unique(first).flip(0).tolist():
        rows = (first == layer).nonzero()[:, 0]
        parts = -(-len(rows) // size)
        yield from torch.tensor_split(rows, parts)


def full_rows(handle: ModelHandle, tokens: torch.Tensor, edits: Edits, query: int,
              reduce: Reduce, batch_size: int = 32, read: str | None = None) -> torch.Tensor:
    """``[n_rows]``: ``reduce`` of each row's logits at ``query``, every row a whole
    forward pass of ``tokens`` (``[1, pos]``) with its edits at ``query``. With ``read``
    (a hook name), ``reduce`` gets that activation of every position instead
    (``[rows, pos, ...]``: an encoder's last hidden state)."""
    out = []
    for rows in _chunks(torch.arange(edits.n_rows), batch_size):
        sub = edits.select(rows)
        kept: dict[str, torch.Tensor] = {}

        def keep(x: torch.Tensor, hook, kept=kept) -> None:
            kept["x"] = x.detach()

        with handle.hooks(z_hooks(sub, query) + ([(read, keep)] if read else [])):
            logits = handle.model(tokens.expand(len(rows), -1))
        out.append(reduce(kept["x"] if read else logits[:, query]))
    return torch.cat(out)


# -- the prefix path -----------------------------------------------------------------------
@contextmanager
def softmax_in_model_dtype(handle: ModelHandle) -> Iterator[None]:
    """TransformerLens 4.x's attention bridge takes its softmax in float32 whatever the
    model's dtype; while this is open, a float64 model's attention takes it in float64, so
    a float64 run is float64 throughout (the prefix path's rows then equal whole forwards
    to round-off: their softmax sums run over other lengths). Other models: unchanged."""
    patched = []
    for module in handle.model.modules():
        original = getattr(type(module), "_masked_softmax", None)
        if original is None or "_masked_softmax" in vars(module):
            continue

        def in_dtype(scores: torch.Tensor, dtype: torch.dtype | None = None, _m=module, _f=original):
            return _f(_m, scores, dtype=None if scores.dtype == torch.float64 else dtype)

        module._masked_softmax = in_dtype
        patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            del module._masked_softmax


def _frozen_update(cache: Any) -> None:
    """Make ``cache`` hand every layer its stored prefix plus the new keys and values
    without storing anything: one cache serves every chunk."""

    def update(key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        layer = cache.layers[layer_idx]
        return torch.cat([layer.keys, key_states], -2), torch.cat([layer.values, value_states], -2)

    cache.update = update


def supports_prefix(handle: ModelHandle) -> str | None:
    """Why the prefix path cannot run on this model (None: it can)."""
    if handle.is_encoder:
        return "an encoder: every position changes after an edit"
    if handle.generation != "bridge":
        return "TransformerLens 3.x (HookedTransformer): the prefix path runs on TransformerBridge"
    if not hasattr(handle.model, "blocks"):
        return "the model has no blocks stack"
    return None


class PrefixRunner:
    """The prefix path for one input: the clean prefix cache and the clean residual at the
    query, computed once; :meth:`run` then runs any rows."""

    def __init__(self, handle: ModelHandle, tokens: torch.Tensor):
        why = supports_prefix(handle)
        if why is not None:
            raise InvalidArgumentError(f"the prefix path does not apply: {why}. Use path='full'.")
        self.handle = handle
        self.tokens = tokens  # [1, query + 1]: the query is the last position
        self.query = tokens.shape[1] - 1
        with _attention_kwargs(handle, None, rows=False), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
            if self.query > 0:
                _, cache = handle.model(tokens[:, :-1], return_type="logits_and_cache")
                if cache.get_seq_length() != self.query:
                    raise InvalidArgumentError(
                        f"the model's cache holds {cache.get_seq_length()} positions after a "
                        f"prefix of {self.query}: its attention does not read a Hugging Face "
                        "cache. Use path='full'.")
                _frozen_update(cache)
                self.cache = cache
            else:
                self.cache = None

    def _forward(self, hooks: list) -> torch.Tensor:
        kwargs: dict[str, Any] = {}
        if self.cache is not None:
            kwargs = {"past_key_values": self.cache, "position_ids": torch.tensor(
                [[self.query]], device=self.tokens.device)}
        with _attention_kwargs(self.handle, self.cache, rows=True), self.handle.hooks(hooks), \
                warnings.catch_warnings():
            # transformers 5 renames the forward's past_key_values to cache, with a warning
            warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)
            return self.handle.model(self.tokens[:, -1:], **kwargs)

    def run(self, edits: Edits, reduce: Reduce, batch_size: int = 64) -> torch.Tensor:
        """``[n_rows]``: ``reduce`` of each row's logits at the query, at most ``batch_size``
        rows per forward."""
        n_layers = self.handle.n_layers
        first = edits.first_layer(n_layers)
        out = torch.empty(edits.n_rows, dtype=torch.float64)
        for rows in layer_chunks(first, batch_size):
            sub = edits.select(rows)
            start = int(first[rows[0]])  # one first layer per chunk
            if start < n_layers:
                hooks = [(hook_names.resid_pre(start), _repeat_rows(len(rows))), *z_hooks(sub, None)]
                logits = self._forward(hooks)  # the rows are positions: [1, rows, d_vocab]
                logits = logits.reshape(len(rows), logits.shape[-1])  # (GPT-2's bridge: [rows, 1, d_vocab])
            else:  # clean rows only
                logits = self._forward([]).reshape(1, -1).expand(len(rows), -1)
            out[rows] = reduce(logits).double().cpu()
        return out


@contextmanager
def _attention_kwargs(handle: ModelHandle, cache: Any, rows: bool) -> Iterator[None]:
    """While open, a forward pre-hook on each attention: hands it the cache under
    ``past_key_values`` (TransformerLens 4.3 reads no other name; transformers 5 passes
    ``cache``), and with ``rows`` (the rows as positions of one sequence) sets its mask to
    ``[1, 1, rows, prefix + rows]``: every row sees the prefix as the clean query does (the
    clean step's own mask row, so sliding windows carry over) and itself."""

    def pre_hook(layer: int):
        def set_kwargs(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if kwargs.get("past_key_values") is None and kwargs.get("cache") is not None:
                kwargs = {**kwargs, "past_key_values": kwargs["cache"]}
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            if not rows or hidden.shape[1] == 1:
                return args, kwargs
            return args, {**kwargs, "attention_mask": _prefix_and_self_mask(
                kwargs.get("attention_mask"), hidden, 0 if cache is None else cache.layers[layer].keys.shape[-2],
                layer)}

        return set_kwargs

    hooks = [block.attn.register_forward_pre_hook(pre_hook(i), with_kwargs=True)
             for i, block in enumerate(handle.model.blocks)]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def _prefix_and_self_mask(mask: torch.Tensor | None, hidden: torch.Tensor, n: int, layer: int) -> torch.Tensor:
    """``[1, 1, rows, n + rows]`` additive: the clean step's mask row over the ``n`` prefix
    keys (``mask``: ``[1, *, 1, n + 1]``, or None: all visible), then each row's own key."""
    rows, low = hidden.shape[1], torch.finfo(hidden.dtype).min
    if mask is None:
        prefix = torch.zeros(n, dtype=hidden.dtype, device=hidden.device)
    else:
        if mask.ndim != 4 or mask.shape[-1] != n + 1 or mask.shape[0] != 1:
            raise InvalidArgumentError(
                f"the prefix path expected layer {layer}'s attention mask [1, *, 1, {n + 1}], "
                f"got {tuple(mask.shape)}. Use path='full'.")
        prefix = mask[0, 0, -1, :n]
        if prefix.dtype == torch.bool:
            prefix = torch.where(prefix, 0.0, low)
        prefix = prefix.to(dtype=hidden.dtype, device=hidden.device)
    own = torch.full((rows, rows), low, dtype=hidden.dtype, device=hidden.device)
    own.fill_diagonal_(0.0)
    return torch.cat([prefix.expand(rows, n), own], -1)[None, None]


def _repeat_rows(n: int):
    def into_rows(resid: torch.Tensor, hook) -> torch.Tensor:  # [1, 1, d] -> [1, n, d]
        return resid.expand(1, n, *resid.shape[2:]).clone()

    return into_rows
