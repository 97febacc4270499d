"""Row-ranking inputs full of ties, shared by the tests of the cut counts and of the
ends-only ranking."""

import torch

from cwlens.faithfulness.ranking import eligible_entries, first_token, tiebreak_scores


def tied_rows(seed, levels, mask_first, window, n):
    """``(scores, eligible, tiebreak, first_key)`` of 3 samples x 2 heads x n x n: scores of
    ``levels`` distinct values (many ties, inside and across the cut), left padding of 5
    and 1 tokens in samples 1 and 2, the seeded tie-break."""
    g = torch.Generator().manual_seed(seed)
    b, h = 3, 2
    position = torch.ones(b, n, dtype=torch.bool)
    position[1, :5] = False  # left padding
    position[2, :1] = False
    scores = torch.randint(0, levels, (b, h, n, n), generator=g).float() / levels
    eligible = eligible_entries(position, True, mask_first, window)
    tb = tiebreak_scores((b, h, n, n), position, ["a", "b", "c"], seed, 0)
    return scores, eligible, tb, first_token(position)
