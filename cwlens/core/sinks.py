"""Attention-sink math on tensors (pure torch).

The **sink** of a sequence is its first real token: position 0 without padding, the
first position where ``position_mask`` is True with left padding (so every row has its
own sink index, a ``[batch]`` long tensor, see :func:`first_real_index`).

The sink rate of a head is the attention mass its queries put on the sink positions,
averaged over the queries after the sink: the sink query can only attend to itself, so
it is left out. Gu et al. (ICLR 2025) call a head a sink head when that mean exceeds
``eps = 0.3``.

The sink-rate curve (``METHOD.md`` section 5). For query ``i`` of head ``h`` with sink
attention ``a0 = a_i0``, hold the tail's proportions and set the sink rate to ``s``::

    a'_i0 = s,   a'_ij = a_ij (1 - s) / (1 - a0)   (j != sink)
    o(s)  = s A + (1 - s) B,   A = v~_0,   B = (o_i - a0 v~_0) / (1 - a0)

``||o(s)||`` is convex in ``s`` (norm of an affine map) and its square is the quadratic
``s^2 |A|^2 + 2 s (1-s) <A,B> + (1-s)^2 |B|^2``. Its minimiser is
``s* = (|B|^2 - <A,B>) / |A - B|^2``, interior to (0, 1) exactly when
``<A,B> < min(|A|^2, |B|^2)``. Every inner product is computed in ``d_head`` space through
``G^h = W_O^h W_O^h^T`` like :class:`~cwlens.core.geometry.AttentionGeometry`.
"""

from functools import cached_property

import torch

from cwlens.core._types import Kind, Pattern, PositionMask, Values
from cwlens.core.geometry import AttentionGeometry, check_kind, safe_divide
from cwlens.errors import ShapeMismatchError

#: Rows whose tail mass ``1 - a_i0`` is below this have no tail to rescale (left unchanged).
TAIL_EPS = 1e-6


def sink_mass(pattern: Pattern, sink_positions=(0,)) -> torch.Tensor:
    """Per-query attention mass on the sink positions: ``[batch, head_index, query_pos]``."""
    return pattern[..., list(sink_positions)].sum(-1)


def sink_rate(
    pattern: Pattern,
    sink_positions=(0,),
    position_mask: PositionMask | None = None,
) -> torch.Tensor:
    """Mean sink mass over the queries after the last sink position: ``[batch, head_index]``.

    With ``position_mask`` (left padding), only real queries count; the sink positions
    are then counted from the first real token of each sequence.
    """
    b, _, q, k = pattern.shape
    if position_mask is None:
        mass = sink_mass(pattern, sink_positions)
        first = max(sink_positions) + 1
        return mass[..., first:].mean(-1)
    rates = []
    for i in range(b):
        real = torch.nonzero(position_mask[i]).flatten()
        start = int(real[0])
        p = pattern[i : i + 1, :, start:, start:]
        rates.append(sink_rate(p, sink_positions)[0])
    return torch.stack(rates)


# -- sink positions ------------------------------------------------------------------------
def first_real_index(
    position_mask: PositionMask | None, batch: int | None = None, device=None
) -> torch.Tensor:
    """The sink index of each row: its first real token, ``[batch]`` long.

    Without a mask every row starts at 0 (pass ``batch``). A row without any real token
    raises :class:`~cwlens.errors.ShapeMismatchError`.
    """
    if position_mask is None:
        if batch is None:
            raise ShapeMismatchError("first_real_index needs position_mask or batch.")
        return torch.zeros(batch, dtype=torch.long, device=device)
    m = position_mask.bool()
    if not m.any(-1).all():
        empty = torch.nonzero(~m.any(-1)).flatten().tolist()
        raise ShapeMismatchError(f"Rows {empty} of position_mask have no real token.")
    return m.long().argmax(-1).to(device or m.device)


def query_after_sink(
    sink_index: torch.Tensor, n_query: int, n_key: int,
    position_mask: PositionMask | None = None, query_start: int | None = None,
) -> torch.Tensor:
    """``[batch, query_pos]`` bool: True for the real queries strictly after the row's sink.

    Queries are the last ``n_query`` of ``n_key`` positions, or positions ``query_start ..
    query_start + n_query - 1`` (a block of rows). With ``position_mask``
    (``[batch, n_key]``, True on real tokens) pad queries are dropped whatever the padding
    side (right-padded encoders have pads *after* the sink too).
    """
    first = n_key - n_query if query_start is None else query_start
    pos = torch.arange(first, first + n_query, device=sink_index.device)
    after = pos[None, :] > sink_index[:, None]
    if position_mask is not None:
        after = after & position_mask.to(after.device).bool()[:, first : first + n_query]
    return after


def key_contribution(geo: AttentionGeometry, key_index: torch.Tensor, kind: Kind = "inter") -> torch.Tensor:
    """One key's contribution weight to every query, ``c_{i, key_index[b]}^h``:
    ``[batch, head_index, query_pos]``.

    The column ``key_index[b]`` of ``geo.contribution(kind)`` without building the
    ``[batch, head, query, key]`` tensor: ``a_ij <o_i W_O^h^T, v_j> / ||o_i||^2`` for the one
    ``j`` of each row (a ``d_head``-sized dot per query). ``geo`` may be a block of rows
    (:meth:`~cwlens.core.geometry.AttentionGeometry.rows`); a key past the block's last key
    (a pad query before the row's first real token) gives 0.
    """
    check_kind(kind)
    b, h, q, k = geo.pattern.shape
    index = key_index.to(geo.pattern.device)
    inside = (index < k).to(geo.pattern.dtype)  # [b]
    index = index.clamp_max(k - 1)
    proj, _ = geo.projection(kind)  # o W_O^h^T: [b, q, h, d]
    inv = geo.inverse_norm(kind, 2)  # 1/||o||^2: [b, h or 1, q]
    v_key = _row_gather(geo.v, index, 1).repeat_interleave(geo.group, dim=1)  # [b, h, d]
    dots = torch.einsum("bqhd,bhd->bhq", proj, v_key.to(proj.dtype))
    alpha = _row_gather(geo.pattern, index, 3)  # [b, h, q]
    return alpha * dots * inv * inside[:, None, None]


def _row_gather(x: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    """``x[b, ..., index[b], ...]`` along ``dim`` (the index dimension is removed)."""
    shape = [1] * x.ndim
    shape[0] = x.shape[0]
    idx = index.view(shape).expand(*x.shape[:dim], 1, *x.shape[dim + 1 :])
    return x.gather(dim, idx).squeeze(dim)


def _grouped(x: torch.Tensor, n_kv: int) -> torch.Tensor:
    """``[batch, head, ...] -> [batch, kv_head, group, ...]`` (a view)."""
    return x.view(x.shape[0], n_kv, x.shape[1] // n_kv, *x.shape[2:])


def key_onehot(index: torch.Tensor, n_key: int, dtype=torch.bool) -> torch.Tensor:
    """``[batch, key_pos]`` one-hot of a per-row key index."""
    return torch.nn.functional.one_hot(index, n_key).to(dtype)


def random_non_sink_index(
    sink_index: torch.Tensor, n_pos: int, generator: torch.Generator | None = None,
    min_offset: int = 1, position_mask: PositionMask | None = None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """A control position per row, uniform over the real positions ``>= sink + min_offset``.

    ``position_mask`` (``[batch, n_pos]``, True on real tokens) keeps the control off pad
    tokens (right padding puts them after the sink); without it every position counts.
    ``uniforms`` (``[batch]`` in [0, 1)): each row's draw, given (e.g. seeded per sample,
    so that a row's control does not depend on its batch); else drawn from ``generator``.
    Returns ``[batch]`` long.
    """
    pos = torch.arange(n_pos)
    ok = pos[None, :] >= (sink_index.cpu() + min_offset)[:, None]  # [b, n_pos]
    if position_mask is not None:
        ok = ok & position_mask.cpu().bool()
    count = ok.sum(-1)
    if (count == 0).any():
        real = (position_mask.cpu().bool().sum(-1) if position_mask is not None
                else torch.full_like(count, n_pos))
        raise ShapeMismatchError(
            f"Rows need at least {min_offset + 1} real tokens for a non-sink control (a "
            f"position at least {min_offset} after the sink); sink indices "
            f"{sink_index.tolist()}, real tokens per row {real.tolist()}, candidates per row "
            f"{count.tolist()}. Use longer texts (CLI: --max-tokens 2 or more).")
    u = torch.rand(sink_index.shape[0], generator=generator) if uniforms is None else uniforms.cpu().double()
    k = (u * count).long().clamp_max(count - 1)  # the k-th candidate of each row
    index = (ok.cumsum(-1) <= k[:, None]).sum(-1)
    return index.to(sink_index.device)


# -- interventions as tensor maps (the hooks in cwlens.engine.interventions.sinks call these) ----
def set_sink_rate(
    pattern: Pattern,
    s,
    sink_index: torch.Tensor | None = None,
    tail_eps: float = TAIL_EPS,
    query_start: int | None = None,
) -> Pattern:
    """Set the attention on the sink to ``s`` and rescale the tail by ``(1 - s)/(1 - a_i0)``.

    Args:
        pattern: ``[batch, head_index, query_pos, key_pos]`` attention probabilities.
        s: a float or a tensor broadcastable to ``[batch, head_index, query_pos]``
            (e.g. per-query rates).
        sink_index: ``[batch]`` sink position of each row (default: 0, see
            :func:`first_real_index` for left padding).

    Rows left unchanged: queries at or before the sink (pad queries with left padding,
    and the sink itself, which can only attend to itself) and rows whose tail mass
    ``1 - a_i0`` is below ``tail_eps`` (nothing to rescale). Rows stay normalised.

    ``query_start``: the position of the first row (default: the rows are the last
    queries, as in a whole pattern); a block of rows from blockwise attention passes it.

    ``1 - a_i0`` is taken as the sum of the tail entries (equal in exact arithmetic): in
    float32, ``1 - a_i0`` loses the digits of a tail of mass ~1e-5 (heads with
    ``a_i0 ~ 1``), the sum of the entries does not.
    """
    b, _, q, k = pattern.shape
    if sink_index is None:
        sink_index = torch.zeros(b, dtype=torch.long, device=pattern.device)
    sink_index = sink_index.to(pattern.device)
    onehot = key_onehot(sink_index, k, pattern.dtype)[:, None, None, :]  # [b, 1, 1, k]
    a0 = (pattern * onehot).sum(-1)  # [b, h, q]
    s = torch.as_tensor(s, dtype=pattern.dtype, device=pattern.device).expand_as(a0)
    tail = (pattern * (1 - onehot)).sum(-1)  # = 1 - a0, summed from the entries (see above)
    ok = query_after_sink(sink_index, q, k, query_start=query_start)[:, None, :] & (tail > tail_eps)
    factor = torch.where(ok, (1 - s) / torch.where(ok, tail, torch.ones_like(tail)), 1.0)
    new = pattern * factor[..., None]
    new = torch.where(ok[..., None] & onehot.bool(), s[..., None], new)
    return new


def scale_position(v: Values, index: torch.Tensor, scale, kv_heads=None) -> Values:
    """Scale the value vector of position ``index[b]`` of every row (``hook_v`` layout).

    Args:
        v: ``[batch, key_pos, kv_head, d_head]``.
        index: ``[batch]`` long, the position to scale in each row.
        scale: a float (0 zeros the value, 1 is the identity).
        kv_heads: optional list of kv heads to scale (default: all).
    """
    b, k, g, _ = v.shape
    mask = key_onehot(index.to(v.device), k, v.dtype)[:, :, None]  # [b, k, 1]
    if kv_heads is not None:
        sel = torch.zeros(g, dtype=v.dtype, device=v.device)
        sel[list(kv_heads)] = 1
        mask = mask * sel
    factor = 1 + (torch.as_tensor(scale, dtype=v.dtype, device=v.device) - 1) * mask
    return v * factor[..., None]


# -- the closed-form curve ----------------------------------------------------------------
def curve_norm(s, aa: torch.Tensor, bb: torch.Tensor, ab: torch.Tensor) -> torch.Tensor:
    """``||s A + (1 - s) B||`` from ``|A|^2, |B|^2, <A,B>``; ``s`` gets a leading axis."""
    s = torch.as_tensor(s, dtype=aa.dtype, device=aa.device)
    s = s.view(-1, *([1] * aa.ndim))
    sq = s**2 * aa + 2 * s * (1 - s) * ab + (1 - s) ** 2 * bb
    return sq.clamp_min(0).sqrt()


def curve_minimizer(aa: torch.Tensor, bb: torch.Tensor, ab: torch.Tensor):
    """``(s_star, interior)``: the unconstrained minimiser ``(|B|^2 - <A,B>) / |A-B|^2`` and
    whether it lies strictly inside (0, 1), i.e. ``<A,B> < min(|A|^2, |B|^2)``.

    Where ``A = B`` the curve is flat: ``s_star`` is NaN and ``interior`` False.
    """
    den = aa - 2 * ab + bb
    s_star = torch.where(den > 0, (bb - ab) / torch.where(den > 0, den, 1.0), float("nan"))
    interior = (ab < torch.minimum(aa, bb)) & (den > 0)
    return s_star, interior


def curve_argmin(aa, bb, ab):
    """The minimiser of ``||o(s)||`` on [0, 1]: ``s_star`` clipped (0 where flat)."""
    s_star, _ = curve_minimizer(aa, bb, ab)
    return torch.nan_to_num(s_star, nan=0.0).clamp(0, 1)


def cosine_from_dots(ab, aa, bb):
    """``<A,B> / (|A| |B|)``, 0 where either is zero."""
    return safe_divide(ab, (aa * bb).clamp_min(0).sqrt())


class SinkGeometry:
    """The sink-vs-tail geometry of one layer, per head and query, in ``d_head`` space.

    Args:
        geo: the layer's :class:`~cwlens.core.geometry.AttentionGeometry` (built with
            the run's ``position_mask``).
        sink_index: ``[batch]`` sink position per row (:func:`first_real_index`).

    Per-query results are ``[batch, head_index, query_pos]``; ``valid`` marks the real
    queries after the sink with a tail to rescale (the others are 0 / False); pad queries
    are read from ``geo.position_mask``, so left and right padding both work.
    """

    def __init__(self, geo: AttentionGeometry, sink_index: torch.Tensor):
        self.geo = geo
        self.sink_index = sink_index.to(geo.pattern.device)
        b, h, q, k = geo.pattern.shape
        self.n_query, self.n_key = q, k
        onehot = key_onehot(self.sink_index, k, geo.pattern.dtype)[:, None, None, :]
        self.alpha0 = (geo.pattern * onehot).sum(-1)  # [b, h, q]
        self._tail_pattern = geo.pattern * (1 - onehot)
        self.tail_mass = self._tail_pattern.sum(-1)  # 1 - a_i0, summed from the entries
        self.real_query = query_after_sink(self.sink_index, q, k, geo.position_mask)  # [b, q]
        self.valid = self.real_query[:, None, :] & (self.tail_mass > TAIL_EPS)
        v0 = _row_gather(geo.v, self.sink_index, 1)  # [b, kv, d]
        self.v0 = v0.repeat_interleave(geo.group, dim=1)  # [b, h, d]

    @cached_property
    def _v0_gram(self) -> torch.Tensor:  # v_0 G^h: [b, h, d]
        return torch.einsum("bhd,hde->bhe", self.v0, self.geo.gram)

    @cached_property
    def tail_z(self) -> torch.Tensor:
        """``B`` in d_head space: ``sum_{j != 0} a_ij v_j / sum_{j != 0} a_ij``,
        ``[batch, head, query, d_head]`` (from the tail entries, not ``z - a0 v_0``, which
        cancels catastrophically in float32 when ``a0 ~ 1``)."""
        geo = self.geo
        z = torch.einsum("bgrqk,bkgd->bgrqd", _grouped(self._tail_pattern, geo.n_kv), geo.v)
        z = z.flatten(1, 2)  # [b, h, q, d]
        tail = torch.where(self.valid, self.tail_mass, torch.ones_like(self.tail_mass))
        return z / tail[..., None] * self.valid[..., None]

    @cached_property
    def dots(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(|A|^2 [b,h,1], |B|^2 [b,h,q], <A,B> [b,h,q])`` for the per-head curve."""
        aa = (self._v0_gram * self.v0).sum(-1)[..., None]
        bg = torch.einsum("bhqd,hde->bhqe", self.tail_z, self.geo.gram)
        bb = (bg * self.tail_z).sum(-1)
        ab = (self._v0_gram[:, :, None] * self.tail_z).sum(-1)
        return aa.expand_as(bb).clamp_min(0), bb.clamp_min(0), ab

    def curve(self, s) -> torch.Tensor:
        """Closed-form ``||o_i^h(s)||``: ``[len(s), batch, head, query]``."""
        return curve_norm(s, *self.dots)

    def minimizer(self):
        """``(s_star, interior)`` per head and query (see :func:`curve_minimizer`)."""
        s_star, interior = curve_minimizer(*self.dots)
        return s_star, interior & self.valid

    @cached_property
    def layer_dots(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The same for the layer output with every head set to ``s``: ``[batch, query]`` each.

        ``A = sum_h v~_0^h``, ``B_i = sum_h B_i^h``, both built in d_model (small).
        """
        W = self.geo.W_O
        A = torch.einsum("bhd,hdm->bm", self.v0, W)
        B = torch.einsum("bhqd,hdm->bqm", self.tail_z, W)
        aa = (A * A).sum(-1)[:, None].expand(B.shape[:2])
        return aa, (B * B).sum(-1), torch.einsum("bm,bqm->bq", A, B)

    @property
    def layer_valid(self) -> torch.Tensor:
        """``[batch, query]``: queries where every head has a tail to rescale."""
        return self.valid.all(1)

    # -- anti-alignment --------------------------------------------------------------
    def value_cosine(self) -> torch.Tensor:
        """``cos(v~_0^h, v~_j^h)`` for every key: ``[batch, head, key_pos]`` (0 on the sink
        and before it; pad keys have zero values, so 0 there too)."""
        vg = _grouped(self._v0_gram, self.geo.n_kv)  # [b, kv, r, d]
        dots = torch.einsum("bgrd,bkgd->bgrk", vg, self.geo.v).flatten(1, 2)
        norm0 = self.dots[0][..., :1]  # [b, h, 1]
        cos = safe_divide(dots, (norm0 * self.geo.value_norm**2).clamp_min(0).sqrt())
        after = torch.arange(self.n_key, device=cos.device)[None] > self.sink_index[:, None]
        return cos * after[:, None, :]

    def output_cosine(self) -> torch.Tensor:
        """``cos(v~_0^h, o_i^h)`` with the head's own output: ``[batch, head, query]``."""
        z = self.geo.z.permute(0, 2, 1, 3)
        dots = (self._v0_gram[:, :, None] * z).sum(-1)
        out_sq = self.geo.output_norm("intra") ** 2
        return safe_divide(dots, (self.dots[0] * out_sq).sqrt()) * self.valid

    def tail_cosine(self) -> torch.Tensor:
        """``cos(A, B)``: sink value vs the renormalised tail mixture, ``[batch, head, query]``."""
        aa, bb, ab = self.dots
        return cosine_from_dots(ab, aa, bb) * self.valid

    def cone_cosine(self) -> torch.Tensor:
        """Cosine of ``o_i^h`` to the mean direction of the tail's projected values
        ``mean_{sink < j <= i} v~_j^h`` (the "semantic cone"): ``[batch, head, query]``."""
        geo = self.geo
        k = self.n_key
        after = (torch.arange(k, device=geo.v.device)[None] > self.sink_index[:, None]).to(geo.v.dtype)
        csum = (geo.v * after[:, :, None, None]).cumsum(1)[:, k - self.n_query :]  # [b, q, kv, d]
        mean_v = csum.repeat_interleave(geo.group, dim=2).permute(0, 2, 1, 3)  # [b, h, q, d]
        mg = torch.einsum("bhqd,hde->bhqe", mean_v, geo.gram)
        m_sq = (mg * mean_v).sum(-1)
        z = geo.z.permute(0, 2, 1, 3)
        dots = (mg * z).sum(-1)
        cos = safe_divide(dots, (m_sq * geo.output_norm("intra") ** 2).clamp_min(0).sqrt())
        return cos * self.real_query[:, None, :]
