"""Attention-sink math on tensors (pure torch).

The sink rate of a head is the attention mass its queries put on the sink positions
(by default the first token), averaged over the queries after the sink: query 0 can only
attend to itself, so it is left out.
"""

import torch

from cwlens._types import Pattern, PositionMask


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
