"""Reducer results as tidy ``pandas`` tables, one row per number (what
``to_dataframe()`` of :class:`~cwlens.reducers.TopKResult`,
:class:`~cwlens.reducers.LayerTensor` and :class:`~cwlens.reducers.KeySetResult` return).

Built with tensor indexing, no loop over entries. With the ``attention_mask`` of a padded
batch (``cwlens.StreamResult.attention_mask``) pad positions are left out and ``query``
and ``key`` count from each text's first real token, so a text's rows read the same
whether it ran alone or in a batch. pandas is imported only here, when a table is asked for.
"""

import torch

from cwlens.errors import InvalidArgumentError, ShapeMismatchError


def _offsets(attention_mask: torch.Tensor | None, batch: int, n: int) -> torch.Tensor:
    """``[batch]``: the position of each row's first real token (0 without a mask)."""
    if attention_mask is None:
        return torch.zeros(batch, dtype=torch.long)
    if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != (batch, n):
        got = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else attention_mask
        raise ShapeMismatchError(
            f"attention_mask is {got}, but this result covers {batch} texts of {n} positions: "
            "pass the mask of the batch it was streamed with (StreamResult.attention_mask).")
    return attention_mask.detach().cpu().bool().int().argmax(-1).long()


def _grid(shape: tuple[int, ...]) -> list[torch.Tensor]:
    return [g.flatten() for g in torch.meshgrid(*(torch.arange(n) for n in shape), indexing="ij")]


def topk_table(res, attention_mask: torch.Tensor | None = None):
    """``layer, batch, head, query, rank, key, value`` of each valid entry of a
    :class:`~cwlens.reducers.TopKResult` (``head = -1``: heads summed)."""
    import pandas as pd  # heavy: pandas, imported on use

    idx, val = res.indices.detach().cpu().long(), res.values.detach().cpu().float()
    n_l, b, h, q, k = idx.shape
    layer, batch, head, query, rank = _grid((n_l, b, h, q, k))
    key = idx.flatten()
    keep = key >= 0  # -1: a row with fewer keys than k (never a pad or masked key)
    offset = _offsets(attention_mask, b, q)[batch]
    df = pd.DataFrame({
        "layer": torch.tensor(res.layers, dtype=torch.long)[layer].numpy(),
        "batch": batch.numpy(),
        "head": (torch.full_like(head, -1) if res.summed_heads else head).numpy(),
        "query": (query - offset).numpy(),
        "rank": rank.numpy(),
        "key": (key - offset).numpy(),
        "value": val.flatten().numpy(),
    })
    return df[keep.numpy()].reset_index(drop=True)


def layer_tensor_table(res, attention_mask: torch.Tensor | None = None):
    """A :class:`~cwlens.reducers.LayerTensor` as a long table: ``layer, batch, head, key,
    value`` (column sums; ``head = -1``: heads summed) or ``layer, batch, query, key,
    value`` (token level)."""
    import pandas as pd  # heavy: pandas, imported on use

    t = res.tensor.detach().cpu().float()
    layers = torch.tensor(res.layers, dtype=torch.long)
    if res.kind == "token_level" and t.ndim == 4:
        n_l, b, q, n = t.shape
        layer, batch, query, key = _grid((n_l, b, q, n))
        offset = _offsets(attention_mask, b, n)
        cols = {"layer": layers[layer], "batch": batch, "query": query - offset[batch],
                "key": key - offset[batch], "value": t.flatten()}
        real = None if attention_mask is None else attention_mask.detach().cpu().bool()
        keep = None if real is None else real[batch, query] & real[batch, key]
    elif res.kind in ("column_sums", "") and t.ndim in (3, 4):
        if t.ndim == 3:  # heads summed
            t = t[:, :, None]
        n_l, b, h, n = t.shape
        layer, batch, head, key = _grid((n_l, b, h, n))
        offset = _offsets(attention_mask, b, n)
        cols = {"layer": layers[layer], "batch": batch,
                "head": torch.full_like(head, -1) if h == 1 and res.tensor.ndim == 3 else head,
                "key": key - offset[batch], "value": t.flatten()}
        keep = None if attention_mask is None else attention_mask.detach().cpu().bool()[batch, key]
    else:
        raise InvalidArgumentError(
            f"no table for a LayerTensor of kind {res.kind!r} and shape {tuple(t.shape)}: tables "
            "exist for ColumnSums ([layer, batch, (head,) key]) and TokenLevel ([layer, batch, "
            "query, key]) results.")
    df = pd.DataFrame({name: value.numpy() for name, value in cols.items()})
    return df if keep is None else df[keep.numpy()].reset_index(drop=True)


def keyset_table(res):
    """A :class:`~cwlens.reducers.KeySetResult` as a long table: ``layer, batch, head,
    query`` and one column per metric, real queries only (``query`` counted from each
    text's first real token)."""
    import pandas as pd  # heavy: pandas, imported on use

    first = next(iter(res.weights.values()))
    n_l, b, h, q = first.shape
    layer, batch, head, query = _grid((n_l, b, h, q))
    real = res.query_mask.detach().cpu().bool()
    offset = real.int().argmax(-1).long()
    cols = {"layer": torch.tensor(res.layers, dtype=torch.long)[layer], "batch": batch,
            "head": head, "query": query - offset[batch]}
    cols.update({m: w.detach().cpu().float().flatten() for m, w in res.weights.items()})
    df = pd.DataFrame({name: value.numpy() for name, value in cols.items()})
    return df[real[batch, query].numpy()].reset_index(drop=True)
