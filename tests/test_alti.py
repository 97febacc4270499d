"""``alti`` (the peers' L1-proximity metric) equals its float64 definition; it is a
first-class metric of the registry, streamed and cached alike."""

import pytest
import torch
from torch.testing import assert_close

from cwlens.core import AttentionGeometry
from cwlens.core.alti import alti_weights
from cwlens.testing import naive_alti, random_layer

SHAPES = [dict(n_heads=4, n_kv=2), dict(n_heads=4, n_kv=4), dict(n_heads=6, n_kv=1)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["intra", "inter"])
def test_alti_equals_naive_float64(shape, kind):
    pattern, v, W_O = random_layer(**shape, seed=3)
    mask = torch.ones(pattern.shape[0], pattern.shape[-1], dtype=torch.bool)
    mask[1, :2] = False  # a left-padded row
    ref = naive_alti(pattern, v, W_O, mask)[f"alti_{kind}"]
    geo = AttentionGeometry(pattern, v, W_O, position_mask=mask)
    assert_close(geo.alti(kind).double(), ref, rtol=1e-4, atol=1e-5)
    assert_close(geo.measure("alti", kind).double(), ref, rtol=1e-4, atol=1e-5)
    # float64 inputs: the fast path is exact to float64 rounding
    geo64 = AttentionGeometry(pattern.double(), v.double(), W_O.double(), position_mask=mask)
    assert_close(geo64.alti(kind), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["intra", "inter"])
def test_alti_rows_sum_to_one_and_blocks_change_nothing(kind):
    pattern, v, W_O = random_layer(seed=4, pos=9)
    geo = AttentionGeometry(pattern.double(), v.double(), W_O.double())
    whole = geo.alti(kind)
    sums = whole.sum(-1) if kind == "intra" else whole.sum((1, 3))
    # 1, or 0 where every part is farther from o than 0 is (||o - z||_1 >= ||o||_1 for all j:
    # possible in L1, e.g. two keys whose terms point apart; llm-transparency-tool's 1e-5
    # clip gives such rows uniform shares instead)
    ones = (sums - 1).abs() < 1e-12
    assert ones.float().mean() > 0.8 and (sums[~ones] == 0).all()
    assert (whole >= 0).all()
    assert (whole[..., torch.ones(9, 9).triu(1).bool()] == 0).all()  # a = 0 -> exactly 0
    # blocks of one query (the memory bound) and row blocks of the streaming engine
    assert_close(alti_weights(geo, kind, max_elements=1), whole, rtol=0, atol=1e-15)
    blocks = [geo.rows(s, s + 4, key_stop=s + 4).alti(kind) for s in (0, 4, 8)]
    padded = torch.zeros_like(whole)
    for s, blk in zip((0, 4, 8), blocks, strict=True):
        padded[:, :, s : s + blk.shape[2], : blk.shape[3]] = blk
    assert_close(padded, whole, rtol=0, atol=1e-15)
