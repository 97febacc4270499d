"""What printed lists and tables show of a row of weights: only the keys the query sees.

A decoder's query ``i`` sees the keys ``0..i``; a pad key is seen by no query. Every
measure is 0 on the other keys, so a top-k list over a whole row (or a fixed-width
top-k result, whose short rows are filled with such keys) would list them beside real
tokens with a value of ``-0.000``. The helpers here leave them out, whichever way a result
marks them (an index of -1 or past the row, a NaN value, a ``valid`` mask, or nothing at
all: the causal rule and the attention mask are applied here too), and print a token
with its position (``12:' the'``: the same token often appears several times).
"""

import math
from collections.abc import Sequence

import torch


def token_at(j: int, tokens: Sequence[str]) -> str:
    """``12:' the'``: the position and the token's repr."""
    return f"{j}:{str(tokens[j])!r}"


def signed(value: "float | torch.Tensor", digits: int = 3) -> str:
    """``+0.034``; a value too small for ``digits`` decimals is written ``+2.1e-05``
    rather than a ``+0.000`` that reads as an exact zero."""
    value = float(value) + 0.0  # -0.0 -> 0.0
    if value != 0 and abs(value) < 0.5 * 10**-digits:
        return f"{value:+.1e}"
    return f"{value:+.{digits}f}"


def plain(value: "float | torch.Tensor", digits: int = 3) -> str:
    """:func:`signed` without the ``+`` of positive values (attention, norms)."""
    text = signed(value, digits)
    return text[1:] if text.startswith("+") else text


def visible_keys(query: int, n_keys: int, causal: bool,
                 key_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``[n_keys]`` bool: the keys ``query`` attends to (``0..query`` on a decoder, every
    key on an encoder), less the pad keys (``key_mask``: 1 on real tokens)."""
    keys = torch.arange(n_keys)
    seen = keys <= query if causal else torch.ones(n_keys, dtype=torch.bool)
    if key_mask is not None:
        seen &= torch.as_tensor(key_mask).reshape(-1)[:n_keys].bool().cpu()
    return seen


def listed_entries(keys, values, query: int, n_keys: int, causal: bool,
                   key_mask: torch.Tensor | None = None, valid=None) -> list[tuple[int, float]]:
    """The ``(key, value)`` pairs of one fixed-width top-k row that are real results, in
    their order: not marked invalid (``valid`` False, index < 0 or past the row, value
    not finite), not after the query on a decoder, not a pad key."""
    keys = torch.as_tensor(keys).reshape(-1).tolist()
    values = torch.as_tensor(values).reshape(-1).tolist()
    ok = [True] * len(keys) if valid is None else torch.as_tensor(valid).reshape(-1).tolist()
    seen = visible_keys(query, n_keys, causal, key_mask)
    return [(int(j), float(v)) for j, v, good in zip(keys, values, ok, strict=True)
            if good and 0 <= j < n_keys and math.isfinite(v) and bool(seen[j])]


def row_top(row: torch.Tensor, query: int, k: int, causal: bool, by_abs: bool = False,
            key_mask: torch.Tensor | None = None) -> list[tuple[int, float]]:
    """The top ``k`` ``(key, value)`` of a dense ``[key]`` row among the keys ``query``
    sees (fewer when it sees fewer), largest first (by ``|value|`` with ``by_abs``)."""
    row = row.detach().float().cpu().reshape(-1)
    seen = visible_keys(query, row.shape[0], causal, key_mask)
    score = row.abs() if by_abs else row
    score = torch.where(seen, score, torch.full_like(score, -math.inf))
    order = score.argsort(descending=True, stable=True)[: min(k, int(seen.sum()))]
    return [(int(j), float(row[j])) for j in order.tolist()]


def entry_list(entries: Sequence[tuple[int, float]], tokens: Sequence[str], digits: int = 3) -> str:
    """``0:'<bos>' +0.999, 13:' day' +2.1e-05`` (``(none)`` for an empty list)."""
    if not entries:
        return "(none)"
    return ", ".join(f"{token_at(j, tokens)} {signed(v, digits)}" for j, v in entries)
