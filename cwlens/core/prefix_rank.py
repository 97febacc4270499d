"""Ranks inside growing prefixes of rows: for every entry, how many entries of its own row
and of the rows before it come first.

For keys ``K [unit, row, m]`` (distinct within a unit; smaller = ranked first) the prefix
rank of entry ``(u, i, e)`` is

    P[u, i, e] = #{(i', e') : i' <= i, K[u, i', e'] < K[u, i, e]}

i.e. its rank among the entries of rows ``0..i`` alone. Computed without a loop over rows:
the within-row rank (an argsort of the argsort), plus, bottom-up over blocks of
``1, 2, 4, ...`` rows, for every entry of a right block the number of smaller keys in
the left block next to it (``searchsorted`` into that block's sorted keys). Every earlier
row lies in exactly one such left block, so the counts add up to ``P``:
``O(log(rows))`` sorts of the unit, instead of one sort per prefix.
"""

import torch

from cwlens.errors import ShapeMismatchError


def prefix_ranks(keys: torch.Tensor) -> torch.Tensor:
    """``P`` (int64, shaped like ``keys``) for integer ``keys [unit, row, m]``."""
    if keys.ndim != 3:
        raise ShapeMismatchError(f"keys must be [unit, row, entries]; got {tuple(keys.shape)}.")
    keys = keys.to(torch.int64)
    u, q, m = keys.shape
    if keys.numel() == 0:
        return keys.clone()
    rows = 1 << max(0, (q - 1).bit_length())  # a power of two: pad with later rows
    if rows > q:
        pad = keys.new_full((u, rows - q, m), int(keys.max()) + 1)
        keys = torch.cat([keys, pad], 1)
    out = keys.argsort(-1).argsort(-1).contiguous()  # smaller keys in the same row
    blocks = keys.sort(-1).values
    size = 1
    while size < rows:
        n = rows // (2 * size)
        left = blocks.view(u, n, 2, size * m)[:, :, 0].contiguous()
        right = keys.view(u, n, 2, size * m)[:, :, 1].contiguous()
        out.view(u, n, 2, size * m)[:, :, 1] += torch.searchsorted(left, right)
        blocks = blocks.view(u, n, 2 * size * m).sort(-1).values.view(u, rows, m)
        size *= 2
    return out[:, :q]
