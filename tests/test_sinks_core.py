"""Unit tier for the sink math (no model): the sweep, the closed form, convexity, cosines."""

import pytest
import torch
from torch.testing import assert_close

from cwlens.core.geometry import AttentionGeometry
from cwlens.core.sinks import (
    SinkGeometry,
    curve_minimizer,
    curve_norm,
    first_real_index,
    random_non_sink_index,
    scale_position,
    set_sink_rate,
)
from cwlens.errors import ShapeMismatchError
from cwlens.sinks.sweep import convex, swept_norms
from cwlens.testing import naive_measures, random_layer

GRID = torch.linspace(0, 1, 21, dtype=torch.float64)


def left_padded(seed=0):
    """A random layer whose rows 1 and 2 start with 2 and 3 pad positions."""
    pattern, v, W_O = random_layer(batch=3, pos=9, seed=seed, dtype=torch.float64)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, :2] = False
    mask[2, :3] = False
    scores = torch.randn(pattern.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    allowed = torch.ones(9, 9, dtype=torch.bool).tril()[None, None] & mask[:, None, None, :]
    pattern = scores.masked_fill(~allowed, float("-inf")).softmax(-1).nan_to_num(0.0)
    return pattern, v, W_O, mask


@pytest.fixture(params=["plain", "padded"])
def layer(request):
    if request.param == "plain":
        pattern, v, W_O = random_layer(batch=2, pos=8, seed=3, dtype=torch.float64)
        mask = None
    else:
        pattern, v, W_O, mask = left_padded(5)
    geo = AttentionGeometry(pattern, v, W_O, position_mask=mask)
    sink = first_real_index(mask, pattern.shape[0])
    return geo, SinkGeometry(geo, sink), mask


def test_first_real_index():
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1]])
    assert first_real_index(mask).tolist() == [2, 0, 1]
    assert first_real_index(None, batch=2).tolist() == [0, 0]
    with pytest.raises(ShapeMismatchError, match="no real token"):
        first_real_index(torch.tensor([[0, 0], [1, 1]]))


def test_set_sink_rate_at_own_rate_is_identity(layer):
    geo, sg, _ = layer
    out = set_sink_rate(geo.pattern, sg.alpha0, sg.sink_index)
    assert_close(out, geo.pattern, rtol=0, atol=1e-12)


def test_set_sink_rate_keeps_tail_proportions_and_rows(layer):
    geo, sg, _ = layer
    out = set_sink_rate(geo.pattern, 0.7, sg.sink_index)
    for b in range(out.shape[0]):
        s0 = int(sg.sink_index[b])
        rows = slice(s0 + 1, None)
        assert_close(out[b, :, rows, s0], torch.full_like(out[b, :, rows, s0], 0.7))
        assert_close(out[b, :, rows].sum(-1), torch.ones_like(out[b, :, rows, 0]))
        tail_new = out[b, :, rows, s0 + 1 :]
        tail_old = geo.pattern[b, :, rows, s0 + 1 :]
        ratio = tail_new * (tail_old.sum(-1, keepdim=True) / tail_new.sum(-1, keepdim=True))
        assert_close(ratio, tail_old)
        assert_close(out[b, :, : s0 + 1], geo.pattern[b, :, : s0 + 1])  # pad + sink rows untouched


def test_closed_form_matches_sweep(layer):
    geo, sg, _ = layer
    swept_h, swept_l = swept_norms(sg, GRID)
    closed = sg.curve(GRID)
    valid = sg.valid.expand_as(closed)
    assert_close(swept_h[valid], closed[valid], rtol=1e-9, atol=1e-9)
    lvalid = sg.layer_valid.expand_as(swept_l)
    closed_l = curve_norm(GRID, *sg.layer_dots)
    assert_close(swept_l[lvalid], closed_l[lvalid], rtol=1e-9, atol=1e-9)


def test_every_swept_curve_is_convex(layer):
    geo, sg, _ = layer
    swept_h, swept_l = swept_norms(sg, GRID)
    assert convex(swept_h, tol=1e-9).all()
    assert convex(swept_l, tol=1e-9).all()


def test_minimizer_and_interior_condition(layer):
    _, sg, _ = layer
    fine = torch.linspace(0, 1, 2001, dtype=torch.float64)
    curve = sg.curve(fine)
    brute = fine[curve.argmin(0)]
    s_star, interior = sg.minimizer()
    inside = interior & sg.valid
    assert_close(s_star[inside], brute[inside], rtol=0, atol=1e-3)
    edge = sg.valid & ~interior
    assert ((brute[edge] == 0) | (brute[edge] == 1)).all()


def test_minimizer_formula_on_known_vectors():
    a = torch.tensor([1.0, 0.0])
    for b, expected in ((torch.tensor([-1.0, 0.0]), 0.5), (torch.tensor([0.0, 1.0]), 0.5)):
        aa, bb, ab = a @ a, b @ b, a @ b
        s_star, interior = curve_minimizer(aa, bb, ab)
        assert float(s_star) == pytest.approx(expected) and bool(interior)
    aa, bb, ab = torch.tensor(1.0), torch.tensor(4.0), torch.tensor(2.0)  # b = 2a: aligned
    s_star, interior = curve_minimizer(aa, bb, ab)
    assert not bool(interior) and float(s_star) == pytest.approx(2.0)


def test_scale_position_zero_removes_exactly_the_sink_term(layer):
    geo, sg, mask = layer
    v0 = scale_position(geo.v, sg.sink_index, 0.0)
    after = AttentionGeometry(geo.pattern, v0, geo.W_O, position_mask=mask)
    ref = naive_measures(geo.pattern, geo.v, geo.W_O)
    v_tilde = torch.einsum(
        "bkhd,hdm->bhkm", geo.v.repeat_interleave(geo.group, 2), geo.W_O
    )
    sink_vec = v_tilde[torch.arange(v_tilde.shape[0]), :, sg.sink_index]  # [b, h, m]
    expected = ref["head_outputs"] - sg.alpha0.permute(0, 2, 1)[..., None] * sink_vec[:, None]
    assert_close(after.head_outputs(), expected, rtol=1e-9, atol=1e-9)
    assert_close(scale_position(geo.v, sg.sink_index, 1.0), geo.v, rtol=0, atol=0)


def test_cosines_match_naive(layer):
    geo, sg, _ = layer
    v_tilde = torch.einsum("bkhd,hdm->bhkm", geo.v.repeat_interleave(geo.group, 2), geo.W_O)
    bidx = torch.arange(v_tilde.shape[0])
    a = v_tilde[bidx, :, sg.sink_index]  # [b, h, m]
    cos_v = torch.nn.functional.cosine_similarity(a[:, :, None], v_tilde, dim=-1)
    keys = torch.arange(v_tilde.shape[2])[None] > sg.sink_index[:, None]
    real = keys[:, None] & (v_tilde.norm(dim=-1) > 0)
    assert_close(sg.value_cosine()[real], cos_v[real])
    o = geo.head_outputs().permute(0, 2, 1, 3)  # [b, h, q, m]
    cos_o = torch.nn.functional.cosine_similarity(a[:, :, None], o, dim=-1)
    assert_close(sg.output_cosine()[sg.valid], cos_o[sg.valid])
    # cone: cosine to the mean tail value up to the query
    csum = (v_tilde * keys[:, None, :, None]).cumsum(2)
    cos_c = torch.nn.functional.cosine_similarity(o, csum, dim=-1)
    assert_close(sg.cone_cosine()[sg.valid], cos_c[sg.valid])


def test_random_non_sink_index():
    sink = torch.tensor([0, 3, 5])
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        idx = random_non_sink_index(sink, 7, gen)
        assert ((idx > sink) & (idx < 7)).all()
    with pytest.raises(ShapeMismatchError):
        random_non_sink_index(torch.tensor([6]), 7)


def test_closed_form_is_stable_in_float32_when_the_sink_takes_almost_everything():
    pattern, v, W_O = random_layer(batch=2, n_heads=4, n_kv=2, pos=64, d_head=16, d_model=32)
    scores = torch.randn(pattern.shape, generator=torch.Generator().manual_seed(1))
    scores[..., 0] += 14  # a_i0 ~ 1 - 1e-5: 1 - a_i0 has ~2 significant digits in float32
    causal = torch.ones(64, 64, dtype=torch.bool).tril()
    pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    sg = SinkGeometry(AttentionGeometry(pattern, v, W_O), first_real_index(None, 2))
    grid = torch.linspace(0, 1, 11)
    swept, _ = swept_norms(sg, grid)
    closed = sg.curve(grid)
    gap = ((swept - closed).abs() / closed.abs().amax(0)).masked_fill(~sg.valid, 0)
    assert float(gap.max()) < 1e-5
