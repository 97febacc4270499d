"""PackedMask: one bit per entry, and the bool tensor back exactly."""

import pytest
import torch

from cwlens.core.bitmask import PackedMask


@pytest.mark.parametrize("shape", [(1,), (3, 8), (2, 3, 5, 13), (1, 2, 7, 16)])
def test_pack_unpack_round_trip(shape):
    g = torch.Generator().manual_seed(sum(shape))
    mask = torch.rand(shape, generator=g) > 0.5
    packed = PackedMask.pack(mask)
    assert torch.equal(packed.unpack(), mask)
    assert packed.nbytes == mask[..., :1].numel() * ((shape[-1] + 7) // 8)
