"""Geometry of one attention layer: contribution weights, baselines and their factors.

Pure torch: this module takes tensors, never a model or a cache, and imports neither
transformer_lens, plotly nor pandas.

For query head ``h`` (kv group ``g``), query ``i`` and key ``j``::

    v~_j^h = v_j^g W_O^h                          projected value   [d_model]
    o_i^h  = sum_j a_ij^h v~_j^h = z_i^h W_O^h      head output (no b_O)
    o_i    = sum_h o_i^h                            layer output (no b_O)

    contribution   c_ij^h = <o, a_ij^h v~_j^h> / ||o||^2 = a * (||v~_j^h|| / ||o||) * cos(o, v~_j^h)

with ``o = o_i^h`` for ``kind="intra"`` (rows sum to 1 over keys) and ``o = o_i`` for
``kind="inter"`` (sums to 1 over heads and keys). The baselines are attention ``a``,
value-weighted ``a ||v~||`` and value-weighted output-normalised ``a ||v~|| / ||o||``.

Nothing of size ``[query, key, head, d_model]`` is ever built. Every inner product goes
through ``d_head``-sized tensors:

    <o, v~_j^h>   = <o W_O^h^T, v_j^g>       one A.V-sized einsum per layer
    ||v~_j^h||^2  = v_j^g G^h v_j^g^T,  G^h = W_O^h W_O^h^T   (d_head x d_head)

so a layer costs about one extra attention-times-values product, and every result has
the size of the attention pattern.

Degenerate outputs: where ``||o|| = 0`` (padding, a head whose values are all zero) the
weights are undefined; they are returned as 0 (never NaN) and flagged by :meth:`zero_output`.
NaN or inf raises :class:`~cwlens.errors.NonFiniteError` naming the layer and the heads: in
the inputs (the pattern, the values, ``W_O``; checked once per layer) and in every measure
and factor a method returns (finite inputs can still overflow, e.g. ``||v~||^2`` past
float32's range): one reduction per tensor, no tensor of the pattern's size.
"""

import functools
import inspect
from functools import cached_property

import torch

from cwlens.core._types import (
    Kind,
    PairWeights,
)
from cwlens.core.alti import alti_attention_weights, alti_weights
from cwlens.core.numerics import check_finite
from cwlens.core.numerics import check_kind as check_kind  # re-exported: callers import it here
from cwlens.core.numerics import safe_divide as safe_divide  # re-exported
from cwlens.errors import (
    EmptyInputError,
    InvalidArgumentError,
    MissingHookError,
    ShapeMismatchError,
    UnknownOptionError,
)


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float32, or float64 if any input already is (bf16/fp16 caches are upcast)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def _checked(method):
    """A method returning a ``[batch, head_index, query_pos, key_pos]`` tensor that is
    refused (:class:`~cwlens.errors.NonFiniteError`, naming the layer and the heads) if
    it holds NaN or inf."""

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        out = method(self, *args, **kwargs)
        check_finite(out, f"the {method.__name__} weights", self.layer, head_dim=1,
                     fix="The inputs are finite, so the computation overflowed: run the model "
                     "in float64 (model.to(torch.float64)) or check the values' and W_O's scale.")
        return out

    return checked


def _measure(method, check: bool = True):
    """Mark a method of :class:`AttentionGeometry` as a per-entry measure (:data:`MEASURES`),
    its result checked for NaN and inf (:func:`_checked`) unless ``check=False`` (a measure
    that returns an input, checked when the geometry is made)."""
    marked = _checked(method) if check else method
    marked.per_entry_measure = True
    return marked


class AttentionGeometry:
    """All per-pair measures of one layer, computed lazily and shared between measures.

    Args:
        pattern: ``[batch, head_index, query_pos, key_pos]`` attention probabilities.
        v: ``[batch, key_pos, kv_head, d_head]`` value vectors (b_V included, as in
            ``hook_v``); ``kv_head`` may equal ``head_index`` or divide it (GQA).
        W_O: ``[head_index, d_head, d_model]`` output projection of this layer.
        position_mask: optional ``[batch, pos]`` bool, True on real tokens. Pad queries
            and pad keys are zeroed in the pattern, so their weights come out as 0.
        layer: only used in error messages.
        query_start: the position of the first query among the keys (default: the last
            ``query_pos`` positions).

    Examples:
        >>> import torch
        >>> from cwlens.core import AttentionGeometry
        >>> pattern = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])  # [batch, head, query, key]
        >>> v = torch.tensor([[[[1.0, 0.0]], [[-2.0, 2.0]]]])      # [batch, key, kv_head, d_head]
        >>> W_O = torch.eye(2)[None]                               # [head, d_head, d_model]
        >>> geo = AttentionGeometry(pattern, v, W_O)
        >>> geo.attention()[0, 0, 1]  # query 1 looks at both keys equally...
        tensor([0.5000, 0.5000])
        >>> geo.contribution("inter")[0, 0, 1]  # ...but key 0 opposes its output o = (-0.5, 1)
        tensor([-0.2000,  1.2000])
        >>> geo.relative_norm("inter")[0, 0, 1], geo.cosine("inter")[0, 0, 1]
        (tensor([0.8944, 2.5298]), tensor([-0.4472,  0.9487]))
    """

    def __init__(
        self,
        pattern: torch.Tensor,  # Pattern; shapes checked by _check_shapes (clearer errors)
        v: torch.Tensor,  # Values
        W_O: torch.Tensor,  # WO
        position_mask: torch.Tensor | None = None,  # PositionMask
        layer: int | None = None,
        query_start: int | None = None,
    ) -> None:
        self.layer = layer
        _check_shapes(pattern, v, W_O, position_mask, layer)
        dtype = compute_dtype(pattern, v, W_O)
        device = pattern.device
        q, k = pattern.shape[2], pattern.shape[3]
        # queries are positions [query_start, query_start + q); by default the last q
        # positions (q < key_pos with a KV cache, or a block of rows from :meth:`rows`)
        self.query_start = k - q if query_start is None else int(query_start)
        if not 0 <= self.query_start <= k - q:
            raise ShapeMismatchError(
                f"query_start={query_start} does not fit {q} queries among {k} keys."
            )
        alpha = pattern.to(dtype)
        if position_mask is not None:
            m = position_mask.to(device=device, dtype=dtype)
            rows = m[:, None, self.query_start : self.query_start + q, None]
            alpha = (alpha * m[:, None, None, :]).mul_(rows)  # one pattern-sized allocation
        self.pattern = alpha
        self.position_mask = None if position_mask is None else position_mask.to(device).bool()
        self.v = v.to(device=device, dtype=dtype)
        if position_mask is not None:  # pad keys: no value, so every factor is 0 there too
            self.v = self.v * position_mask.to(device=device, dtype=dtype)[:, :, None, None]
        self.W_O = W_O.to(device=device, dtype=dtype)
        _check_finite(self.pattern, self.v, layer, self.W_O)
        self.n_heads = pattern.shape[1]
        self.n_kv = v.shape[2]
        self.group = self.n_heads // self.n_kv
        self._dots: dict[str, torch.Tensor] = {}
        self._residual: tuple | None = None

    def attach_residual(self, residual: torch.Tensor, b_O: torch.Tensor, norm=None) -> "AttentionGeometry":
        """Give this layer the residual stream the full ALTI needs (:mod:`cwlens.core.alti`).

        ``residual``: ``[batch, pos, d_model]`` stream entering the layer (``hook_resid_pre``,
        every position); ``b_O``: ``[d_model]``; ``norm``: a
        :class:`~cwlens.core.alti.PostNorm` where a LayerNorm follows the residual sum
        (post-LN encoders), a function returning one (read when ALTI asks), or None.
        Returns ``self``.
        """
        b, _, _, k = self.pattern.shape
        if residual.ndim != 3 or residual.shape[:2] != (b, k) or residual.shape[-1] != self.W_O.shape[-1]:
            raise ShapeMismatchError(
                f"residual must be [batch, pos, d_model] = [{b}, {k}, {self.W_O.shape[-1]}]; "
                f"got {tuple(residual.shape)}. Pass hook_resid_pre of the same layer and run."
            )
        check_finite(residual, "the residual stream entering the layer (hook_resid_pre)", self.layer)
        check_finite(b_O, "the output bias b_O", self.layer)
        self._residual = (residual.to(self.pattern.device), b_O.to(self.pattern.device), norm)
        return self

    def require_residual(self, what: str) -> tuple:
        """``(residual of this geometry's queries [batch, query_pos, d_model], b_O, norm)``,
        or a :class:`~cwlens.errors.MissingHookError` saying how to get it."""
        if self._residual is None:
            raise MissingHookError(
                f"{what} needs the residual stream entering the layer (hook_resid_pre): this "
                "geometry has none. Use cwlens.stream / the faithfulness sweep (which catch "
                "it), call geometry.attach_residual(resid_pre, b_O), or ask for "
                "'alti_attention' (the attention output as the whole) instead."
            )
        residual, b_O, norm = self._residual
        if callable(norm):  # read lazily (it may raise for a model ALTI does not cover)
            norm = norm()
        q = self.pattern.shape[2]
        return residual[:, self.query_start : self.query_start + q], b_O, norm

    def rows(self, start: int, stop: int, key_stop: int | None = None) -> "AttentionGeometry":
        """The geometry of queries ``[start, stop)`` of this one (a block of rows).

        Every per-pair measure of a query depends only on that query's row of the pattern
        and on the (shared) values, so measures of the block equal the same rows of the
        whole layer's. ``key_stop`` keeps only keys ``[0, key_stop)``: for a causal layer
        the keys after the block's last query have ``a = 0`` and so weight 0 in every
        measure, and need not be computed. The block shares ``v``, ``W_O`` and the key
        norms with this one; its pattern is a view, so a block costs only what its own
        measures allocate.
        """
        q, k = self.pattern.shape[2], self.pattern.shape[3]
        start, stop = max(0, start), min(q, stop)
        width = k if key_stop is None else min(k, key_stop)
        return self._block(self.pattern[:, :, start:stop, :width], self.query_start + start)

    def with_rows(self, pattern: torch.Tensor, query_start: int) -> "AttentionGeometry":
        """The geometry of queries ``[query_start, query_start + rows)`` of this layer from
        their own pattern rows ``[batch, head, rows, key_stop]`` over keys ``[0, key_stop)``
        (the keys after are 0), computed elsewhere: blockwise attention hands a layer over
        in such blocks. Pad queries and keys are masked as in the constructor; ``v``,
        ``W_O`` and the key norms are shared with this one (see :meth:`rows`)."""
        b, h, q, k = pattern.shape
        n_keys = self.v.shape[1]
        if b != self.v.shape[0] or h != self.n_heads or k > n_keys or not 0 <= query_start <= n_keys - q:
            raise ShapeMismatchError(
                f"Rows {tuple(pattern.shape)} at query {query_start} do not fit this layer "
                f"(batch {self.v.shape[0]}, {self.n_heads} heads, {n_keys} keys)."
            )
        alpha = pattern.to(self.v.dtype)
        if self.position_mask is not None:
            m = self.position_mask.to(alpha.dtype)
            alpha = alpha * m[:, None, None, :k]
            alpha.mul_(m[:, None, query_start : query_start + q, None])
        _check_finite(alpha, self.v[:, :1], self.layer)
        return self._block(alpha, query_start)

    def _block(self, pattern: torch.Tensor, query_start: int) -> "AttentionGeometry":
        keys = slice(0, pattern.shape[3])
        block = object.__new__(AttentionGeometry)
        block.layer = self.layer
        block.query_start = query_start
        block.pattern = pattern
        block.position_mask = self.position_mask
        block.v, block.W_O = self.v[:, keys], self.W_O
        block.n_heads, block.n_kv, block.group = self.n_heads, self.n_kv, self.group
        block._dots = {}
        block._residual = self._residual
        block.__dict__["gram"] = self.gram  # key-side quantities: computed once per layer
        block.__dict__["value_norm"] = self.value_norm[..., keys]
        return block

    # -- shared intermediates ------------------------------------------------------------
    @cached_property
    def z_heads(self) -> torch.Tensor:
        """Per-head mixed values ``sum_j a_ij v_j`` as attention computes them:
        ``[batch, head_index, query_pos, d_head]`` (contiguous; :attr:`z` is a view of it)."""
        b, h, q, k = self.pattern.shape
        # one batched matmul per kv group: [b, g, (r q), k] @ [b, g, k, d]
        grouped = self.pattern.reshape(b, self.n_kv, self.group * q, k)
        return torch.matmul(grouped, self.v.permute(0, 2, 1, 3)).view(b, h, q, self.v.shape[-1])

    @cached_property
    def z(self) -> torch.Tensor:
        """Per-head mixed values ``sum_j a_ij v_j``: ``[batch, query_pos, head_index, d_head]``
        (a permuted view of :attr:`z_heads`)."""
        return self.z_heads.permute(0, 2, 1, 3)

    @cached_property
    def gram(self) -> torch.Tensor:
        """``G^h = W_O^h W_O^h^T``: ``[head_index, d_head, d_head]``."""
        return self.W_O @ self.W_O.transpose(-1, -2)

    @cached_property
    def value_norm(self) -> torch.Tensor:
        """``||v~_j^h||``: ``[batch, head_index, key_pos]``."""
        g = self.gram.view(self.n_kv, self.group, *self.gram.shape[1:])
        vg = torch.einsum("bkgd,grde->bgrke", self.v, g)
        sq = (vg * self.v.permute(0, 2, 1, 3)[:, :, None]).sum(-1)
        return sq.clamp_min(0).sqrt().flatten(1, 2)

    @cached_property
    def layer_output(self) -> torch.Tensor:
        """``o_i = sum_h z_i^h W_O^h`` (no b_O): ``[batch, query_pos, d_model]``."""
        return torch.einsum("bqhd,hdm->bqm", self.z, self.W_O)

    def head_outputs(self) -> torch.Tensor:
        """``o_i^h``: ``[batch, query_pos, head_index, d_model]`` (not cached: it is large)."""
        return torch.einsum("bqhd,hdm->bqhm", self.z, self.W_O)

    @cached_property
    def _intra(self) -> tuple[torch.Tensor, torch.Tensor]:
        proj = torch.einsum("bqhd,hde->bqhe", self.z, self.gram)  # o^h W_O^h^T
        norm_sq = (proj * self.z).sum(-1).clamp_min(0).permute(0, 2, 1)  # [b, h, q]
        return proj, norm_sq

    @cached_property
    def _inter(self) -> tuple[torch.Tensor, torch.Tensor]:
        # o is built first: ||o||^2 = sum_{h,h'} z^h G^{hh'} z^h' through the Gram matrix
        # loses precision quadratically where heads cancel (14% in ||o|| at a 2847x ratio
        # in float32), and in float64 it is slower than this path (tests/
        # test_geometry_cancellation.py; 2048 tokens, SmolLM2 shape: 30 ms vs 41 ms).
        o = self.layer_output
        proj = torch.einsum("bqm,hdm->bqhd", o, self.W_O)  # o W_O^h^T
        norm_sq = (o * o).sum(-1)[:, None, :]  # [b, 1, q]
        return proj, norm_sq

    def projection(self, kind: Kind) -> tuple[torch.Tensor, torch.Tensor]:
        """``(o W_O^h^T [batch, query_pos, head_index, d_head], ||o||^2 [batch, head or 1,
        query_pos])``: per head (intra) or of the layer's output (inter)."""
        proj, norm_sq = self._intra if check_kind(kind) == "intra" else self._inter
        # the inputs are finite (checked in __init__): only an overflow gets here
        check_finite(norm_sq, f"the squared norm of the attention output ({kind})", self.layer,
                     head_dim=1 if kind == "intra" else None,
                     fix="The pattern, the values and W_O are finite, so ||o||^2 overflowed: "
                     "run the model in float64 (model.to(torch.float64)) or check the values' scale.")
        return proj, norm_sq

    def output_norm(self, kind: Kind = "inter") -> torch.Tensor:
        """``||o_i^h||`` ``[batch, head_index, query_pos]`` (intra) or ``||o_i||`` ``[batch, 1, query_pos]`` (inter)."""
        return self.projection(kind)[1].sqrt()

    def zero_output(self, kind: Kind = "inter") -> torch.Tensor:
        """True where ``||o|| = 0``, so that the weights there are set to 0, not NaN."""
        return self.projection(kind)[1] == 0

    def inverse_norm(self, kind: Kind, power: float) -> torch.Tensor:
        """``||o||^-power`` (0 where ``||o|| = 0``), ``[batch, head or 1, query_pos]``."""
        norm_sq = self.projection(kind)[1]
        ok = norm_sq > 0
        inv = torch.where(ok, norm_sq, torch.ones_like(norm_sq)).pow(-power / 2)
        return inv * ok

    def _pair_dot(self, proj: torch.Tensor) -> torch.Tensor:
        """``<proj_i^h, v_j^g>`` for a ``[batch, query_pos, head_index, d_head]`` projection."""
        b, q, h, d = proj.shape
        p = proj.reshape(b, q, self.n_kv, self.group, d)
        return torch.einsum("bqgrd,bkgd->bgrqk", p, self.v).flatten(1, 2)

    def dot(self, kind: Kind = "inter") -> PairWeights:
        """``<o_i, v~_j^h>`` (unweighted by attention): ``[batch, head_index, query_pos, key_pos]``."""
        if kind not in self._dots:
            self._dots[kind] = self._pair_dot(self.projection(kind)[0])
        return self._dots[kind]

    # -- the measures --------------------------------------------------------------------
    # Each is one einsum and/or one pass over the [batch, head, query, key] tensor: the
    # per-query scalings (1/||o||, 1/||o||^2) are applied to small tensors first. The
    # per-entry importance measures are marked @_measure (MEASURES, :meth:`measure`).
    @functools.partial(_measure, check=False)  # the pattern: checked in __init__
    def attention(self) -> PairWeights:
        return self.pattern

    @_measure
    def value_weighted(self) -> PairWeights:
        """``a_ij ||v~_j||`` (Kobayashi et al., 2020)."""
        return self.pattern * self.value_norm[:, :, None, :]

    @_measure
    def value_weighted_output_normalized(self, kind: Kind = "inter") -> PairWeights:
        """``a_ij ||v~_j|| / ||o_i||``."""
        out = self.pattern * self.inverse_norm(kind, 1)[..., None]  # one allocation, two passes
        return out.mul_(self.value_norm[:, :, None, :])

    @_measure
    def contribution(self, kind: Kind = "inter") -> PairWeights:
        """``<o_i, a_ij v~_j> / ||o_i||^2``, signed."""
        proj = self.projection(kind)[0]
        inv = self.inverse_norm(kind, 2)  # [b, h or 1, q] -> scale the projection, not the pairs
        scaled = proj * inv.permute(0, 2, 1)[..., None]
        return self._pair_dot(scaled).mul_(self.pattern)  # in place: no second big buffer

    @_measure
    def contribution_abs(self, kind: Kind = "inter") -> PairWeights:
        """``|c_ij|``: the contribution's magnitude."""
        return self.contribution(kind).abs_()  # a fresh tensor: abs in place

    @_checked
    def relative_norm(self, kind: Kind = "inter") -> PairWeights:
        """``||v~_j|| / ||o_i||`` broadcast to ``[batch, head_index, query_pos, key_pos]``."""
        rel = self.inverse_norm(kind, 1)[..., None] * self.value_norm[:, :, None, :]
        return rel.expand_as(self.pattern)

    @_checked
    def cosine(self, kind: Kind = "inter") -> PairWeights:
        """``cos(o_i, v~_j)``; 0 where either vector is zero."""
        inv_v = safe_divide(torch.ones_like(self.value_norm), self.value_norm)
        scale = self.inverse_norm(kind, 1)[..., None] * inv_v[:, :, None, :]
        return self.dot(kind) * scale

    @_measure
    def alti(self) -> PairWeights:
        """ALTI (Ferrando et al. 2022): L1 proximity of ``a_ij v~_j`` to the residual stream
        after attention, the residual one more part (:mod:`cwlens.core.alti`; needs
        :meth:`attach_residual`; costs ``O(n^2 d_model)``, not ``O(n^2 d_head)``)."""
        return alti_weights(self)

    @_measure
    def alti_attention(self, kind: Kind = "inter") -> PairWeights:
        """L1 proximity of ``a_ij v~_j`` to the attention output ``o`` only, normalised per
        row (:mod:`cwlens.core.alti`; not the peers' ALTI: no residual, no norm)."""
        return alti_attention_weights(self, kind)

    def measure(self, metric: str, kind: Kind = "inter") -> PairWeights:
        """One of this class's per-entry measures by name (:data:`MEASURES`, the methods
        of those names; ``kind`` goes to those that take it). cwlens' metric registry
        (:mod:`cwlens.core.metrics`) holds these and any other metric
        (:func:`cwlens.core.metrics.from_geometry`); this class does not read it."""
        if metric not in MEASURES:
            raise UnknownOptionError(
                f"Unknown metric={metric!r}. Valid metrics: {', '.join(map(repr, MEASURES))}."
            )
        method = getattr(self, metric)
        return method(kind) if "kind" in inspect.signature(method).parameters else method()


# the per-entry measures of one layer, by method name (what :meth:`AttentionGeometry.measure` takes)
MEASURES: tuple[str, ...] = tuple(
    name for name, fn in vars(AttentionGeometry).items() if getattr(fn, "per_entry_measure", False)
)


def _check_finite(pattern: torch.Tensor, v: torch.Tensor, layer: int | None,
                  W_O: torch.Tensor | None = None) -> None:
    """NaN or inf in the pattern, the values or ``W_O`` poisons every measure of the layer
    (attention included: its rows would no longer be the heads' mixing weights).

    One reduction each (no tensor of the pattern's size, :func:`~cwlens.core.numerics.check_finite`),
    naming the layer and the heads.
    """
    check_finite(pattern, "the attention pattern (hook_pattern)", layer, head_dim=1)
    check_finite(v, "the values (hook_v; heads are kv heads)", layer, head_dim=2)
    if W_O is not None:
        check_finite(W_O, "the output projection W_O (a model weight)", layer, head_dim=0,
                     fix="A weight that is not finite breaks the model itself (its logits are "
                     "NaN too): reload the model or find the parameter with torch.isfinite.")


def _check_position_mask(position_mask, where: str) -> None:
    """0 (padding) and 1 (real token), at least one 1 per row: 0.5 everywhere read as all
    real (contributions summing to 14 over 7 positions) and all 0 as an empty sum."""
    if not isinstance(position_mask, torch.Tensor):
        raise InvalidArgumentError(
            f"position_mask must be a [batch, pos] tensor of 0/1{where}; got "
            f"{type(position_mask).__name__} (convert it with torch.as_tensor).")
    if position_mask.ndim != 2:
        raise ShapeMismatchError(f"position_mask must be [batch, pos]{where}; got shape "
                                 f"{tuple(position_mask.shape)}.")
    if bool(((position_mask != 0) & (position_mask != 1)).any()):
        raise InvalidArgumentError(
            f"position_mask must hold 0 (padding) and 1 (real token) only{where}.")
    empty = (position_mask.sum(-1) == 0).nonzero().flatten().tolist()
    if empty:
        raise EmptyInputError(f"position_mask row {empty[0]} has no real token (all 0){where}: "
                              "every row needs at least one 1.")


def _check_shapes(pattern, v, W_O, position_mask, layer) -> None:
    where = "" if layer is None else f" (layer {layer})"
    for name, t in (("pattern", pattern), ("v", v), ("W_O", W_O)):
        if not isinstance(t, torch.Tensor):
            raise InvalidArgumentError(
                f"{name} must be a torch.Tensor{where}; got {type(t).__name__} (convert it with "
                "torch.as_tensor).")
        if not t.is_floating_point():
            raise InvalidArgumentError(
                f"{name} must be a floating-point tensor{where}; got {t.dtype} (attention "
                "probabilities, values and weights are real numbers: pass .float() of them).")
        if t.device.type == "meta":
            raise InvalidArgumentError(
                f"{name} is on the meta device{where} (no data): load the model's weights first.")
    if position_mask is not None:
        _check_position_mask(position_mask, where)
    if pattern.ndim != 4 or v.ndim != 4 or W_O.ndim != 3:
        raise ShapeMismatchError(
            f"Expected pattern [batch, head, query, key], v [batch, key, kv_head, d_head] and "
            f"W_O [head, d_head, d_model]{where}; got pattern {tuple(pattern.shape)}, "
            f"v {tuple(v.shape)}, W_O {tuple(W_O.shape)}."
        )
    b, h, q, k = pattern.shape
    bv, kv_pos, g, d = v.shape
    if 0 in (b, q, k):
        raise EmptyInputError(
            f"Empty input{where}: the pattern is {tuple(pattern.shape)} (batch, head, query, "
            "key); run the model on at least one text of at least one token."
        )
    problems = []
    if bv != b or kv_pos != k:
        problems.append(f"v has batch/key_pos {(bv, kv_pos)} but the pattern has {(b, k)}")
    if W_O.shape[0] != h or W_O.shape[1] != d:
        problems.append(
            f"W_O is {tuple(W_O.shape)} but the pattern has {h} heads and v has d_head={d}"
        )
    if g == 0 or h % g != 0:
        problems.append(f"{g} kv heads do not divide {h} query heads")
    if position_mask is not None and tuple(position_mask.shape) != (b, k):
        problems.append(
            f"position_mask is {tuple(position_mask.shape)}, expected (batch, pos) = {(b, k)}"
        )
    if problems:
        raise ShapeMismatchError(
            f"Shape mismatch{where}: "
            + "; ".join(problems)
            + ". Was the cache made by this model, with this attention mask?"
        )
