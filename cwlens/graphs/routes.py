"""Information-flow routes (Ferrando & Voita 2024, *Information Flow Routes*): from a
target node at the top, walk down the graph keeping, at each layer, the incoming edges of
the nodes reached so far whose weight is at least a threshold; their sources are the
nodes reached one layer lower. Pure NumPy, on a graph's ``[block, pos, slot]`` edge arrays.
"""

import numpy as np


def route_mask(from_position: np.ndarray, weight: np.ndarray, target: int, threshold: float,
               absolute: bool = False) -> np.ndarray:
    """``[block, pos, slot]`` bool: the edges on a route to node ``(top, target)``.

    ``from_position`` ``[block, pos, slot]`` (-1: no edge) and ``weight`` (same shape) are
    the edges into the nodes of each block's layer, blocks bottom to top; ``threshold``
    keeps edges with ``weight >= threshold`` (``absolute=True``: ``|weight| >= threshold``,
    so that a strongly negative edge is a route too)."""
    n_blocks, n = from_position.shape[:2]
    keep = np.zeros(from_position.shape, dtype=bool)
    reached = np.zeros(n, dtype=bool)
    reached[target] = True
    for block in range(n_blocks - 1, -1, -1):
        w = np.nan_to_num(weight[block], nan=-np.inf)
        strong = (np.abs(w) if absolute else w) >= threshold
        keep[block] = reached[:, None] & (from_position[block] >= 0) & strong
        below = np.zeros(n, dtype=bool)
        below[from_position[block][keep[block]]] = True
        reached = below
    return keep
