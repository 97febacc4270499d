"""Heads that cancel: ||o|| and c stay accurate in float32 on long sequences.

Two heads read the same values with the same pattern and write through
``W_O^1 = -(1 - delta) W_O^0``: the layer output is ``delta`` times one head's output
(cancellation ratio ``sum_h ||o^h|| / ||o|| ~ 2 / delta``). Computing ``||o||^2`` as
``sum_{h,h'} z^h G^{hh'} z^h'`` loses precision quadratically in that ratio (float32:
~14% error in ||o|| at a ratio of ~2800); building ``o`` first does not.
"""

import pytest
import torch
from torch.testing import assert_close

from cwlens.core import AttentionGeometry
from cwlens.testing import naive_measures, random_layer


@pytest.mark.parametrize("delta", [1e-2, 1e-3])
def test_cancelling_heads_on_a_long_sequence(delta):
    pattern, v, W_O = random_layer(batch=1, n_heads=1, n_kv=1, pos=40, d_head=8, d_model=16, seed=3)
    pattern = pattern.expand(1, 2, 40, 40).contiguous()
    v = v.expand(1, 40, 2, 8).contiguous() * 30
    W_O = torch.cat([W_O, -(1 - delta) * W_O], 0)  # [2, d_head, d_model]
    assert pattern.shape[2] > W_O.shape[-1]  # the long-sequence regime (q > d_model)
    geo = AttentionGeometry(pattern, v, W_O)
    ref = naive_measures(pattern, v, W_O)
    norm = geo.output_norm("inter").double().squeeze(1)
    want = ref["layer_output"].norm(dim=-1)
    assert_close(norm, want, rtol=1e-4, atol=0)
    c_ref = ref["contribution_inter"]  # float32 error in o itself is linear in the ratio
    err = (geo.contribution("inter").double() - c_ref).abs().max() / c_ref.abs().max()
    assert err < 1e-4
