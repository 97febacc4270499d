"""Boolean masks stored at one bit per entry (8x smaller than ``torch.bool``).

The faithfulness sweep ranks each layer's entries once, on the clean pass, and must keep
the resulting ``[batch, head, query, key]`` masks of every layer until the masked passes
run: packed, one condition over all layers costs ``layers * batch * head * n^2 / 8`` bytes.
Pure torch.
"""

from dataclasses import dataclass

import torch

_BITS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


@dataclass(frozen=True)
class PackedMask:
    """A bool tensor of ``shape`` packed along its last axis (padded to a multiple of 8)."""

    bits: torch.Tensor  # uint8 [..., ceil(last / 8)]
    shape: tuple[int, ...]

    @classmethod
    def pack(cls, mask: "torch.Tensor | PackedMask") -> "PackedMask":
        """``mask`` packed (a PackedMask already is: returned as it is)."""
        if isinstance(mask, PackedMask):
            return mask
        m = mask.bool()
        pad = (-m.shape[-1]) % 8
        if pad:
            m = torch.nn.functional.pad(m, (0, pad))
        groups = m.unflatten(-1, (-1, 8)).to(torch.uint8)
        bits = (groups * _BITS.to(m.device)).sum(-1, dtype=torch.uint8)
        return cls(bits, tuple(mask.shape))

    def unpack(self) -> torch.Tensor:
        """The bool tensor of :attr:`shape`."""
        bits = self.bits[..., None] & _BITS.to(self.bits.device)
        return (bits != 0).flatten(-2)[..., : self.shape[-1]]

    def unpack_rows(self, start: int, n_rows: int) -> torch.Tensor:
        """Rows ``[start, start + n_rows)`` of the second-to-last axis, unpacked (a block of
        query rows of a ``[batch, head, query, key]`` mask)."""
        rows = PackedMask(self.bits.narrow(-2, start, n_rows),
                          (*self.shape[:-2], n_rows, self.shape[-1]))
        return rows.unpack()

    @property
    def nbytes(self) -> int:
        return self.bits.numel()
