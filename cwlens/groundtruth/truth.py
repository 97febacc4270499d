"""The ground truth of one input, from the RASP program (never from the network).

For an input ``BOS x_1 ... x_m`` (positions ``0..m``; the program sees ``x_1 ... x_m``):

(a) ``dependence [n, n]`` (query/output position, input position): True where changing
    the input token at that position to *some* other vocabulary token changes the
    program's output at the query position (``tracr.rasp.rasp.evaluate``, every
    alternative token tried: exhaustive). Row and column 0 (the BOS) are False.
(b) ``movement [n_layers, n_heads, n, n]``: per attention head of the converted model,
    the (query, key) pairs whose selector holds *and* whose aggregated value is non-zero,
    i.e. the pairs the head moves something along. Categorical ``Aggregate``: every
    selected key with a value (not None); numerical ``Aggregate``: selected keys whose
    value is not 0 (zero-valued keys still shape a numerical mean, through the
    normalisation, but move nothing: they are in ``selected``, not in ``movement``).
    ``SelectorWidth``: tracr computes it by attending to the selected keys *and* the BOS,
    whose value (1) is the only one: movement is (query, BOS) for every query; the
    selected keys dilute it (``selected``). ``fallback [n_layers, n_heads, n]``: an
    ``Aggregate`` query whose selector matches no key: tracr's attention then falls back
    to the BOS, whose value is zero, so the head moves nothing there.
    ``selected [n_layers, n_heads, n, n]``: the selector itself (the keys that shape the
    output). Heads no operation uses, and the BOS query (row 0), are all False.
(c) ``components`` (on ``CompiledProgram``, not per input): the compiled graph's heads
    and MLPs (:mod:`cwlens.groundtruth.compiler`).
"""

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cwlens.errors import InvalidArgumentError
from cwlens.groundtruth.compiler import Placement


@dataclass(frozen=True)
class Truth:
    """The ground truth of one input (see the module docstring for each field).

    Attributes:
        tokens: the input, BOS first.
        dependence: ``[n, n]`` bool (a).
        movement: ``[n_layers, n_heads, n, n]`` bool (b).
        fallback: ``[n_layers, n_heads, n]`` bool (b): the query matched nothing.
        selected: ``[n_layers, n_heads, n, n]`` bool: the selector holds.
        output: the program's output (``rasp.evaluate``), BOS first.
    """

    tokens: list
    dependence: torch.Tensor
    movement: torch.Tensor
    fallback: torch.Tensor
    selected: torch.Tensor
    output: list


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if a is None or b is None:
            return a is b
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    return bool(a == b)


def _evaluate(program: Any, xs: list) -> list:
    """``rasp.evaluate(program, xs)``; an error of the program on that input is one
    :class:`~cwlens.errors.InvalidArgumentError` naming the input."""
    from tracr.rasp import rasp  # optional: tracr (the tracr extra)

    try:
        return list(rasp.evaluate(program, xs))
    except Exception as err:
        raise InvalidArgumentError(
            f"the RASP program fails on the input {['BOS', *xs]!r:.200}: {type(err).__name__}: "
            f"{' '.join(str(err).split())}: its truth cannot be computed; fix the operation "
            "(e.g. a mean of tokens that are not numbers) or the vocabulary.") from err


def compute(program: Any, tokens: list, vocab: tuple, placements: list[Placement],
            n_layers: int, n_heads: int) -> Truth:
    """The :class:`Truth` of ``tokens`` (BOS first) for ``program``, with tracr's evaluator.

    ``placements``: where each operation runs (:func:`cwlens.groundtruth.compiler.placements`).
    """
    from tracr.compiler import rasp_to_graph  # optional: tracr (the tracr extra)
    from tracr.rasp import rasp

    xs = list(tokens[1:])
    m = len(xs)
    n = m + 1
    output = _evaluate(program, xs)
    if rasp.is_numerical(program):  # the evaluator keeps a mean of one bool as the bool
        output = [None if v is None else float(v) for v in output]
    dependence = np.zeros((n, n), dtype=bool)
    for i in range(m):
        for alternative in vocab:
            if alternative == xs[i]:
                continue
            changed = _evaluate(program, xs[:i] + [alternative] + xs[i + 1:])
            for q in range(m):
                if not _same(changed[q], output[q]):
                    dependence[q + 1, i + 1] = True
    graph = rasp_to_graph.extract_rasp_graph(program).graph
    exprs = [node["EXPR"] for node in graph.nodes.values()]
    movement = np.zeros((n_layers, n_heads, n, n), dtype=bool)
    selected = np.zeros_like(movement)
    fallback = np.zeros((n_layers, n_heads, n), dtype=bool)
    for p in placements:
        if p.head is None:
            continue
        expr = exprs[p.node]
        select = np.array(rasp.evaluate(expr.selector, xs), dtype=bool).reshape(m, m)  # [q, k]
        selected[p.layer, p.head, 1:, 1:] = select
        if p.kind == "selector_width":
            movement[p.layer, p.head, 1:, 0] = True
            continue
        values = rasp.evaluate(expr.sop, xs)
        if rasp.is_numerical(expr):
            carries = np.array([v is not None and float(v) != 0 for v in values])
        else:
            carries = np.array([v is not None for v in values])
        movement[p.layer, p.head, 1:, 1:] = select & carries[None, :]
        fallback[p.layer, p.head, 1:] = ~select.any(1)
    t = torch.from_numpy
    return Truth(list(tokens), t(dependence), t(movement), t(fallback), t(selected),
                 [tokens[0], *output])


def reach(movement: torch.Tensor) -> torch.Tensor:
    """``[n, n]`` bool: the input positions whose information can reach each position's
    final residual along the movements (b), layer after layer, the residual stream carrying
    each position's own: ``R_0 = I``, ``R_{l+1} = R_l or (M_l R_l)`` with ``M_l`` the union
    of layer ``l``'s heads. (a) is what the output depends on; this is where (b) could
    have carried it."""
    n = movement.shape[-1]
    r = torch.eye(n, dtype=torch.bool)
    for layer in movement:
        m = layer.any(0).double()
        r = r | ((m @ r.double()) > 0)
    return r


def pack(truths: list[Truth]) -> dict[str, np.ndarray]:
    """The truths of inputs as flat arrays (for an ``.npz``): each field concatenated,
    with the lengths to cut them back."""
    lengths = np.array([len(t.tokens) for t in truths])
    cat = {name: np.concatenate([getattr(t, name).numpy().reshape(-1) for t in truths])
           for name in ("dependence", "movement", "fallback", "selected")}
    return {"lengths": lengths, **{k: np.packbits(v) for k, v in cat.items()},
            **{f"{k}_size": np.array(v.size) for k, v in cat.items()}}


def unpack(arrays: dict, inputs: list[list], outputs: list[list], n_layers: int,
           n_heads: int) -> list[Truth]:
    """The truths :func:`pack` wrote (``inputs`` and ``outputs`` from the JSON beside it)."""
    flat = {k: np.unpackbits(arrays[k])[: int(arrays[f"{k}_size"])].astype(bool)
            for k in ("dependence", "movement", "fallback", "selected")}
    shapes = {"dependence": lambda n: (n, n), "movement": lambda n: (n_layers, n_heads, n, n),
              "fallback": lambda n: (n_layers, n_heads, n), "selected": lambda n: (n_layers, n_heads, n, n)}
    offsets = dict.fromkeys(flat, 0)
    truths = []
    for tokens, output in zip(inputs, outputs, strict=True):
        n = len(tokens)
        parts = {}
        for k, shape in shapes.items():
            size = int(np.prod(shape(n)))
            parts[k] = torch.from_numpy(flat[k][offsets[k]: offsets[k] + size].reshape(shape(n)).copy())
            offsets[k] += size
        truths.append(Truth(list(tokens), parts["dependence"], parts["movement"], parts["fallback"],
                            parts["selected"], list(output)))
    return truths
