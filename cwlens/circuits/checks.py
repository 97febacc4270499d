"""What the circuit functions check before they index a cache: positions, key positions,
token ids, the batch index and the residual hooks. A wrong position wrapped round (target
999 of 11 positions gave position 9's graph) or raised a bare IndexError deep in torch."""

import operator

import torch

from cwlens.engine import hook_names
from cwlens.errors import InvalidArgumentError, MissingHookError, ShapeMismatchError


def index(value, n: int, what: str) -> int:
    """An int (NumPy and 0-d tensors too) in ``[-n, n)``, as a non-negative index."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{what} must be an integer position; got {value!r}.")
    try:
        i = operator.index(value)
    except TypeError:
        raise InvalidArgumentError(f"{what} must be an integer position; got {value!r}.") from None
    if not -n <= i < n:
        raise InvalidArgumentError(
            f"{what} {i} is out of range: there are {n} (use 0..{n - 1}, or -{n}..-1 from the end).")
    return i % n


def positions(queries, n: int, what: str = "queries") -> torch.Tensor:
    """A non-empty list of positions in ``[-n, n)`` as a long tensor of non-negative ones."""
    if isinstance(queries, str | bytes) or not hasattr(queries, "__iter__"):
        raise InvalidArgumentError(f"{what} must be a list of positions, e.g. [-1]; got {queries!r}.")
    items = queries.tolist() if isinstance(queries, torch.Tensor) else list(queries)
    if not items:
        raise InvalidArgumentError(f"{what} is empty: give at least one position (e.g. [-1]); "
                                   "the scores are means over them.")
    return torch.tensor([index(q, n, f"{what} position") for q in items], dtype=torch.long)


def key_positions(keys, queries: torch.Tensor, batch: int, n: int, causal: bool) -> torch.Tensor:
    """``[batch, n_queries]`` key positions in ``[0, n)``; on a causal model none after its
    query (there every weight is 0 by construction, and reads as a measured 0)."""
    if not isinstance(keys, torch.Tensor):
        raise InvalidArgumentError(f"keys must be a [batch, n_queries] tensor of positions; got "
                                   f"{type(keys).__name__}.")
    if keys.dtype.is_floating_point or keys.dtype == torch.bool or keys.shape != (batch, len(queries)):
        raise ShapeMismatchError(
            f"keys must be a [batch, n_queries] = [{batch}, {len(queries)}] integer tensor (one key "
            f"per query); got {keys.dtype} {tuple(keys.shape)}.")
    if bool(((keys < 0) | (keys >= n)).any()):
        raise InvalidArgumentError(f"keys hold positions outside 0..{n - 1} (e.g. "
                                   f"{int(keys[(keys < 0) | (keys >= n)][0])}).")
    if causal and bool((keys.cpu() > queries[None, :]).any()):
        raise InvalidArgumentError(
            "keys hold a position after its query: on a causal model that weight is 0 by "
            "construction, not a measurement; give keys at or before each query.")
    return keys


def token_ids(ids, shape: tuple[int, ...], d_vocab: int, what: str) -> None:
    """An integer tensor of ``shape`` with ids in ``[0, d_vocab)``."""
    if not isinstance(ids, torch.Tensor) or ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise InvalidArgumentError(f"{what} must be an integer tensor of token ids; got "
                                   f"{type(ids).__name__}{'' if not isinstance(ids, torch.Tensor) else ' ' + str(ids.dtype)}.")
    if tuple(ids.shape) != tuple(shape):
        raise ShapeMismatchError(f"{what} must be [batch, n_queries] = {list(shape)}; got "
                                 f"{list(ids.shape)}.")
    bad = (ids < 0) | (ids >= d_vocab)
    if bool(bad.any()):
        raise InvalidArgumentError(f"{what} hold token ids outside the vocabulary 0..{d_vocab - 1} "
                                   f"(e.g. {int(ids[bad][0])}).")


def residual_hooks(cache, model, what: str) -> None:
    """The residual-stream hooks the token flow and direct logit attribution read, which
    :func:`cwlens.run_with_cache` leaves out."""
    if not callable(getattr(cache, "keys", None)):
        return  # adapter.read names a cache that is not one
    name = hook_names.resid_mid(0)
    if name not in cache.keys():
        raise MissingHookError(
            f"{what} reads the residual stream ({name!r}, hook_mlp_out, ...), which this cache "
            "does not hold (cwlens.run_with_cache keeps only what the attention measures need). "
            "Run the model with cwlens.circuits.run_with_cache(model, tokens).")


def real_queries(mask, queries: torch.Tensor, keys: torch.Tensor | None = None) -> None:
    """On a padded batch (``mask``: ``[batch, pos]``, 1 on real tokens, e.g. the one
    remembered with the cache, ``adapter.cache_mask``; None: unpadded), refuse a
    query or key position that is padding in some row: its scores are no token's, and a
    mean over the batch would average them in (a pad query's contribution share is 0)."""
    if mask is None:
        return
    real = mask.bool().cpu()
    pad = ~real[:, queries]  # [batch, n_queries]
    if bool(pad.any()):
        row, col = (int(x) for x in pad.nonzero()[0])
        raise InvalidArgumentError(
            f"query position {int(queries[col])} is padding in row {row} of this padded batch "
            f"(the row has {int(real[row].sum())} real tokens of {real.shape[1]}). Choose "
            "positions every text has: on a decoder (padded on the left) count from the end "
            "(-1 is each text's last token); or pass the texts one at a time.")
    if keys is not None:
        pad = ~real.gather(1, keys.cpu().long())
        if bool(pad.any()):
            row, col = (int(x) for x in pad.nonzero()[0])
            raise InvalidArgumentError(
                f"key position {int(keys[row, col])} of row {row} is padding in this padded "
                "batch: give keys at the row's real tokens (cwlens.attention_mask_of(cache)).")
