"""Rankings of attention entries by an importance metric, and the masks they give.

An *entry* is ``(layer, head h, query i, key j)``: the term ``a_ij^h v~_j^h`` of head
``h``'s output at query ``i``. A ranking sorts the eligible entries of each *scope unit*
from most to least important; a mask for removal rate ``r`` then takes exactly
``k = round_half_up(r * n_eligible)`` entries of every unit:

    comprehensiveness   the k top-ranked entries   (a faithful metric: big damage)
    sufficiency         the k bottom-ranked entries (a faithful metric: small damage)

so that at ``r = 1`` both masks are every eligible entry, and at ``r = 0`` nothing.

Parameters (with defaults, also used by :mod:`cwlens.faithfulness.sweep`):

``metric``
    any of :mod:`cwlens.core.metrics`: ``attention`` (a), ``value_weighted`` (a ||v~||),
    ``value_weighted_output_normalized`` (a ||v~|| / ||o||), ``contribution`` (signed c:
    a strongly negative entry ranks *least* important), ``contribution_abs`` (|c|),
    ``random`` (seeded control); the peers' ``alti`` (L1 proximity, Ferrando et al. 2022)
    and the supervised references ``attention_gradient`` (-a dL/da) and
    ``attention_gradient_abs``.
``kind="inter"``
    ``o`` for the output-normalised baseline and the contribution: the layer's
    multi-head output (``"intra"``: the head's own output).
``scope="row"``
    ``"row"``: one unit per (sample, layer, head, query) -- every query keeps ``1 - r`` of
    its keys in every head. ``"head"``: per (sample, layer, head), across queries.
    ``"layer"``: per (sample, layer), across heads and queries. Note: with
    ``kind="inter"`` and ``scope="row"``, ``value_weighted_output_normalized`` orders a
    row exactly as ``value_weighted`` (``||o_i||`` is constant along a row); the two only
    differ with ``scope="head"`` or ``"layer"``.
``causal_only=True``
    only keys ``j <= i`` are eligible (for decoders the others are 0 anyway; for an
    encoder, False makes the whole row eligible).
``mask_first_token=True``
    the first real token (the BOS / attention-sink position) is eligible. Default True:
    the sink is exactly where attention and the value-aware metrics disagree most, and
    protecting it would exempt the entry that carries most attention mass from the
    test. ``False`` is the ablation that keeps the sink's term in every row.

Pad positions (attention_mask 0) are never eligible, neither as queries nor as keys, and
neither are keys outside a sliding-window layer's window (``i - j >= window``).
Ties are broken by a seeded random order (``tiebreak``, :func:`tiebreak_scores`: one
uniform draw per entry, seeded by the run's seed, the sample and the layer), not by key
order: where a metric gives many entries the same score (ALTI's zeros, attention's
exact 0s), key order would fill a mask with the first keys (the BOS sink).
:func:`mask_counts` reports, per mask, how many removed entries were chosen by that
tie-break and how many sit on the first token.
"""

import hashlib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from cwlens.core import metrics
from cwlens.core._types import Kind, Mode, Scope
from cwlens.engine import native
from cwlens.errors import InvalidArgumentError, ShapeMismatchError, UnknownOptionError

# every metric a ranking can use (the registry, cwlens.core.metrics: at import; metrics.NAMES
# follows metrics.registered), the default sweep's, and the protocol's options
ALL_RANKINGS: tuple[str, ...] = metrics.NAMES
RANKINGS: tuple[str, ...] = metrics.DEFAULT
SCOPES: tuple[Scope, ...] = metrics.SCOPES
MODES: tuple[Mode, ...] = metrics.MODES


def check_option(value: str, valid: Sequence[str], what: str) -> str:
    if value not in valid:
        raise UnknownOptionError(
            f"Unknown {what}={value!r}. Valid: {', '.join(repr(v) for v in valid)}."
        )
    return value


def n_to_mask(rate: float, n_eligible: torch.Tensor) -> torch.Tensor:
    """``round_half_up(rate * n)`` per unit (float64, so 0.3 * 10 is 3, 0.5 * 5 is 3)."""
    if not 0.0 <= rate <= 1.0:
        raise InvalidArgumentError(f"rate must be in [0, 1] (the fraction of entries removed); got {rate}.")
    return torch.floor(rate * n_eligible.to(torch.float64) + 0.5).to(n_eligible.dtype)


def eligible_entries(
    position_mask: torch.Tensor,
    causal_only: bool = True,
    mask_first_token: bool = True,
    window: int | None = None,
) -> torch.Tensor:
    """bool ``[batch, 1, query_pos, key_pos]``: entries that a mask may remove.

    ``position_mask``: ``[batch, pos]``, True (1) on real tokens. ``window``: a sliding-
    window layer's size (:meth:`cwlens.engine.handle.ModelHandle.attention_window`): keys with
    ``i - j >= window`` are outside it (alpha = 0 there), so not eligible.
    """
    n = position_mask.shape[1]
    return eligible_rows(position_mask, RowBlock(0, n, n), causal_only, mask_first_token, window)


class RowBlock(NamedTuple):
    """Queries ``[query_start, query_start + n_rows)`` over keys ``[0, key_stop)`` of a
    layer: a block of query rows, ranked alone at row scope."""

    query_start: int
    n_rows: int
    key_stop: int


def eligible_rows(position_mask: torch.Tensor, block: RowBlock, causal_only: bool = True,
                  mask_first_token: bool = True, window: int | None = None) -> torch.Tensor:
    """bool ``[batch, 1, n_rows, key_stop]``: the rows of :func:`eligible_entries` of one
    block (the same entries, without building the ``[n, n]`` whole)."""
    real = position_mask.bool()
    q0, q1 = block.query_start, block.query_start + block.n_rows
    elig = real[:, None, q0:q1, None] & real[:, None, None, : block.key_stop]
    i = torch.arange(q0, q1, device=real.device)[:, None]
    j = torch.arange(block.key_stop, device=real.device)[None, :]
    if causal_only:
        elig = elig & (j <= i)
    if window is not None:
        elig = elig & (i - j < window)
    if not mask_first_token:
        elig = elig & ~first_token(real)[..., : block.key_stop]
    return elig


def first_token(position_mask: torch.Tensor) -> torch.Tensor:
    """bool ``[batch, 1, 1, key_pos]``: True at each row's first real token."""
    real = position_mask.bool()
    first = real.int().argmax(-1)
    return (torch.arange(real.shape[1], device=real.device)[None, :] == first[:, None])[:, None, None, :]


@dataclass(frozen=True)
class Ranking:
    """Ranks of one layer's entries inside their scope units.

    ``rank``: int32 ``[batch, head_index, query_pos, key_pos]``; 0 = most important;
    eligible entries of a unit have ranks ``0..n-1``, ineligible ones ``>= n``.
    ``n_eligible``: int64, broadcastable to ``rank`` (``[b, h, q, 1]`` row,
    ``[b, h, 1, 1]`` head, ``[b, 1, 1, 1]`` layer).
    ``depth``: None (every rank exact), or ``(top, bottom)`` for a row ranking exact only
    for the ``top + 1`` best and ``bottom + 1`` worst entries of each row
    (:mod:`cwlens.faithfulness.partial_ranking`): masks of at most ``top``
    (comprehensiveness) / ``bottom`` (sufficiency) entries.
    """

    rank: torch.Tensor
    n_eligible: torch.Tensor
    scope: Scope
    depth: tuple[int, int] | None = None

    def mask(self, rate: float, mode: Mode) -> torch.Tensor:
        """bool ``[batch, head_index, query_pos, key_pos]``: the entries to remove."""
        check_option(mode, MODES, "mode")
        k = n_to_mask(rate, self.n_eligible)
        if self.depth is not None:
            limit = self.depth[0 if mode == "comprehensiveness" else 1]
            if int(k.max()) > limit:
                raise ValueError(f"this ranking is exact for {mode} masks of at most {limit} "
                                 f"entries a row; rate {rate} needs {int(k.max())}.")
        if mode == "comprehensiveness":
            return self.rank < k
        return (self.rank >= self.n_eligible - k) & (self.rank < self.n_eligible)

    def fingerprint(self) -> bytes:
        """A digest of the ranks: two rankings with equal fingerprints give equal masks."""
        return hashlib.blake2b(self.rank.cpu().numpy().tobytes(), digest_size=16).digest()


def _units(t: torch.Tensor, scope: Scope) -> torch.Tensor:
    """``[batch, head, query, key]`` viewed as ``[..., unit entries]`` of ``scope``."""
    b, h, q, k = t.shape
    if scope == "row":
        return t
    return t.reshape(b, h, q * k) if scope == "head" else t.reshape(b, h * q * k)


def rank_entries(scores: torch.Tensor, eligible: torch.Tensor, scope: Scope = "row",
                 tiebreak: torch.Tensor | None = None) -> Ranking:
    """Rank ``scores`` ``[batch, head, query, key]`` (higher = more important) per unit.

    ``eligible`` broadcasts to ``scores`` (see :func:`eligible_entries`). ``tiebreak``:
    scores of the same shape that order entries with equal ``scores`` (higher first;
    :func:`tiebreak_scores`); None keeps key order among ties.
    """
    check_option(scope, SCOPES, "scope")
    if scores.ndim != 4:
        raise ShapeMismatchError(
            f"scores must be [batch, head_index, query_pos, key_pos]; got {tuple(scores.shape)}."
        )
    b, h, q, k = scores.shape
    elig = eligible.expand(b, h, q, k)
    s = scores.float().masked_fill(~elig, float("-inf"))
    if scope == "row":
        flat, n = s, elig.sum(-1, keepdim=True)
    elif scope == "head":
        flat, n = s.reshape(b, h, q * k), elig.sum((-2, -1), keepdim=True)
    else:
        flat, n = s.reshape(b, h * q * k), elig.sum((-3, -2, -1), keepdim=True)
    if tiebreak is None:
        order = torch.sort(flat, dim=-1, descending=True, stable=True).indices
    else:  # by score, then the random order among ties, then key order: one sort
        key = order_keys(flat, _units(tiebreak.to(s.device).float().expand(b, h, q, k), scope))
        order = torch.sort(key, dim=-1, descending=True, stable=True).indices
        del key
    rank = torch.empty(order.shape, dtype=torch.int32, device=s.device)
    positions = torch.arange(order.shape[-1], dtype=torch.int32, device=s.device)
    rank.scatter_(-1, order, positions.expand(order.shape))
    return Ranking(rank.reshape(b, h, q, k), n.to(torch.int64), scope)


def order_keys(scores: torch.Tensor, ties: torch.Tensor) -> torch.Tensor:
    """int64 keys ordered by ``scores``, then by ``ties`` (both float32, same shape):
    ``sort_key(scores) * 2^32 + sort_key(ties)``, built in place."""
    key = sort_key(scores).to(torch.int64)
    key <<= 32
    key += sort_key(ties)
    return key


def sort_key(x: torch.Tensor) -> torch.Tensor:
    """int32 keys ordered as the float32 values ``x`` (``-0.0`` and ``0.0`` equal, ``-inf``
    lowest): ``sort_key(score) * 2^32 + sort_key(tiebreak)`` in int64 (tiebreak >= 0)
    sorts by score, then by tie-break, in one sort."""
    bits = (x.float() + 0.0).view(torch.int32)  # + 0.0: -0.0 becomes 0.0
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)  # negative floats: lower 31 bits flipped


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    """:func:`_mix32` in place (``x``: a fresh int64 tensor)."""
    for _ in range(2):
        x ^= x >> 16
        x *= 0x45D9F3B
        x &= 0xFFFFFFFF
    x ^= x >> 16
    return x


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (two multiply-xorshift rounds) of int64 values in [0, 2^32)."""
    for _ in range(2):
        x = (((x >> 16) ^ x) * 0x45D9F3B) & 0xFFFFFFFF
    return (x >> 16) ^ x


def position_uniforms(h: int, n: int, key: str) -> torch.Tensor:
    """float64 ``[h, n, n]`` uniforms in [0, 1), one per (head, query, key) *position*,
    seeded by ``key``: entry ``(h, i, j)`` is the same whatever ``n`` is, so a text and
    any of its prefixes get the same draws (a row's order never depends on later tokens).
    53 bits from two 32-bit hashes of (seed, head, query, key)."""
    every = torch.arange(n, dtype=torch.int64)
    return uniforms_at(h, every, every, key)


def uniforms_at(h: int, queries: torch.Tensor, keys: torch.Tensor, key: str,
                dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """``[h, len(queries), len(keys)]`` uniforms (float64, or rounded once to ``dtype``):
    the draws of :func:`position_uniforms` at these (int64) query and key positions only
    (a counter-based hash: any block of rows gets exactly the whole's values). Computed
    in pieces of ~2^15 entries, in place: the hash is bound by memory traffic."""
    base = zlib.crc32(key.encode())
    hh = torch.arange(h, dtype=torch.int64)[:, None, None]
    rows = _mix32(_mix32((hh + base) & 0xFFFFFFFF) ^ queries.to(torch.int64)[None, :, None])
    if dtype in (torch.float32, torch.float64):
        if native.available():  # the same values in one pass (tests/test_native_masks.py)
            return native.uniforms(rows, keys, dtype).reshape(h, len(queries), len(keys))
    out = torch.empty(h, len(queries), len(keys), dtype=dtype)
    flat, jj = rows.reshape(-1, 1), keys.to(torch.int64)[None, :]
    o = out.view(-1, len(keys))
    step = max(1, (1 << 15) // max(len(keys), 1))
    for a in range(0, flat.shape[0], step):
        x = _mix32_(flat[a : a + step] ^ jj)
        y = _mix32_(x ^ 0x5BD1E995)
        x <<= 21
        x += y >> 11
        o[a : a + step] = x.double() / float(2**53)
    return out


def _on_real_positions(shape: Sequence[int], position_mask: torch.Tensor,
                       seeds: Sequence[str], query_start: int = 0) -> torch.Tensor:
    """float32 ``shape`` zeros with each sample's :func:`position_uniforms` (seeded by
    ``seeds[row]``) laid on its real positions (pads keep 0). ``shape``
    ``[batch, head, rows, keys]`` may be a block of rows from ``query_start`` over keys
    ``[0, keys)``: the draws are those of the whole layer's same entries."""
    h, n_rows, n_keys = shape[1], shape[2], shape[3]
    out = torch.zeros(tuple(shape), dtype=torch.float32)
    real = position_mask.bool().cpu()
    for row, seed in enumerate(seeds):
        ordinal = real[row].long().cumsum(0) - 1  # a position's index among the real ones
        qi = (real[row, query_start : query_start + n_rows]).nonzero().flatten()
        kj = real[row, :n_keys].nonzero().flatten()
        if not (len(qi) and len(kj)):
            continue
        draws = uniforms_at(h, ordinal[qi + query_start], ordinal[kj], seed, torch.float32)
        if _is_range(qi) and _is_range(kj):  # real tokens are contiguous (one-sided padding)
            out[row, :, int(qi[0]) : int(qi[-1]) + 1, int(kj[0]) : int(kj[-1]) + 1] = draws
        else:
            out[row, :, qi[:, None], kj[None, :]] = draws
    return out.to(position_mask.device)


def _is_range(idx: torch.Tensor) -> bool:
    return int(idx[-1]) - int(idx[0]) + 1 == len(idx)


def random_scores(
    shape: Sequence[int],
    position_mask: torch.Tensor,
    sample_keys: Sequence[str],
    seed: int,
    layer: int,
    query_start: int = 0,
) -> torch.Tensor:
    """Seeded uniform scores ``[batch, head, query, key]`` for the ``random`` control.

    Each sample draws its own ``[head, n_real, n_real]`` block of
    :func:`position_uniforms` seeded by ``(seed, sample key, layer)``, so the masks do not
    depend on the batch a sample is in, on its padding, or on tokens after a query.
    """
    return _on_real_positions(shape, position_mask,
                              [f"{seed}:{key}:{layer}" for key in sample_keys], query_start)


def tiebreak_scores(shape: Sequence[int], position_mask: torch.Tensor,
                    sample_keys: Sequence[str], seed: int, layer: int,
                    query_start: int = 0) -> torch.Tensor:
    """The seeded random order that breaks ties in :func:`rank_entries`.

    :func:`position_uniforms` seeded by ``(seed, layer)`` only -- not by the sample -- and
    laid on each sample's real positions: the order between two tied entries depends on
    their (head, query, key) positions alone, so a text, any of its prefixes and the same
    text in another request (lm-eval scores a continuation whole and token by token as
    different requests) break ties the same way. It is a stream apart from the ``random``
    control's (which is seeded per sample). ``sample_keys`` only sets the batch size."""
    return _on_real_positions(shape, position_mask, [f"ties:{seed}:{layer}"] * len(sample_keys),
                              query_start)


def mask_counts(scores: torch.Tensor | None, eligible: torch.Tensor, mask: torch.Tensor,
                scope: Scope, first_key: torch.Tensor) -> torch.Tensor:
    """int64 ``[batch, 3]``: per sample, the removed entries, those of them chosen by the
    tie-break, and those on the first token.

    A removed entry was chosen by the tie-break when an eligible entry that stays has the
    same score (the unit's cut falls inside a block of ties). ``scores`` None (a mask of
    every eligible entry) has no cut. ``first_key``: bool ``[batch, 1, 1, key]``, True at
    each row's first real token.
    """
    b = mask.shape[0]
    removed = mask.sum((1, 2, 3))
    first = (mask & first_key).sum((1, 2, 3))
    if scores is None:
        return torch.stack([removed, torch.zeros_like(removed), first], -1).to(torch.int64)
    s = _units(scores.float(), scope)
    m, e = _units(mask, scope), _units(eligible.expand(mask.shape), scope)
    kept = e & ~m
    inf = float("inf")
    lo_removed = s.masked_fill(~m, inf).amin(-1, keepdim=True)
    hi_removed = s.masked_fill(~m, -inf).amax(-1, keepdim=True)
    hi_kept = s.masked_fill(~kept, -inf).amax(-1, keepdim=True)
    lo_kept = s.masked_fill(~kept, inf).amin(-1, keepdim=True)
    # comprehensiveness cuts below the removed block, sufficiency above it; either way a
    # tie across the cut is a kept entry scored like a removed one at the cut
    tied = m & (((s == lo_removed) & (lo_removed == hi_kept)) | ((s == hi_removed) & (hi_removed == lo_kept)))
    return torch.stack([removed, tied.reshape(b, -1).sum(-1), first], -1).to(torch.int64)


def add_counts(counts: dict | None, key, c: torch.Tensor) -> None:
    """Add one layer's (or query block's) :func:`mask_counts` to ``counts[key]`` (None:
    not counting)."""
    if counts is not None:
        counts[key] = counts[key] + c.cpu() if key in counts else c.cpu()


def mask_shares(counts: torch.Tensor) -> dict:
    """``tied_share`` (removed entries chosen by the tie-break) and ``first_token_share``
    (removed entries on the first token) from one sample's :func:`mask_counts` row; NaN
    where nothing was removed."""
    n = int(counts[0])
    nan = float("nan")
    return {"tied_share": int(counts[1]) / n if n else nan,
            "first_token_share": int(counts[2]) / n if n else nan}


def metric_scores(geometry, metric: str, kind: Kind = "inter",
                  gradient_scores=None) -> torch.Tensor:
    """Scores of one non-random metric: a geometry metric from an
    :class:`~cwlens.core.AttentionGeometry`, a gradient metric from this layer's signed
    ``-a * dL/da`` (``gradient_scores``, see :mod:`cwlens.engine.gradients`)."""
    entry = metrics.get(metric)
    if entry.source == "random" or entry.compute is None:
        raise ValueError("metric='random' has no geometry; use random_scores().")
    if entry.source == "gradient":
        if gradient_scores is None:
            raise ValueError(f"metric={metric!r} needs this layer's gradient scores "
                             "(cwlens.engine.gradients.attention_gradient).")
        return entry.compute(gradient_scores, kind)
    return entry.compute(geometry, kind)
