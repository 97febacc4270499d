"""Does the compiled network compute its RASP program? :func:`check_agreement` refuses a
program whose network's output differs from the program's on an input to be scored (the
truth comes from the program, so it would not describe what the network computed).

tracr compiles some programs silently wrong: a categorical ``Aggregate`` whose selector
picks several keys of different values (a categorical mean), or a numerical ``Aggregate``
of a variable that is not 0/1 ("Attention patterns can currently only average binary
variables"). Its own dynamic validation (``tracr.compiler.validating.dynamic_validate``)
names such operations on an input; where the RASP program is at hand, its reason is in
the error.

Positions where the program has no output (RASP's ``None``: ``prev_token``'s first
position, a ``successor`` query with no successor) are not compared: the network writes
nothing there and tracr's argmax picks among float noise (:func:`cwlens.groundtruth.codec.written`).
"""

from collections.abc import Sequence
from typing import Any

import torch

from cwlens.errors import InvalidArgumentError
from cwlens.groundtruth.codec import decode, encode

NUMERICAL_TOLERANCE = 1e-3  # a numerical output within this of the program's is the same


def first_difference(network: Sequence, program: Sequence) -> int | None:
    """The first position ``>= 1`` where the network's decoded output differs from the
    program's (RASP's ``None`` positions are skipped), or None where they agree."""
    if len(network) != len(program):
        return min(len(network), len(program))
    for q, (x, y) in enumerate(zip(network, program, strict=True)):
        if q == 0 or y is None:
            continue
        if isinstance(x, float) or isinstance(y, float):
            if x is None or abs(float(x) - float(y)) > NUMERICAL_TOLERANCE:
                return q
        elif x != y:
            return q
    return None


def tracr_reasons(program: Any, tokens: Sequence) -> list[str]:
    """tracr's dynamic validation of the program on one input (BOS first): the reason of
    each operation tracr compiles wrong there; ``[]`` where the RASP program is not at
    hand (a shipped program loaded without tracr) or tracr finds nothing."""
    rasp_program = getattr(program, "_cache", {}).get("program")
    if rasp_program is None:
        return []
    from tracr.compiler import validating  # optional: tracr (the tracr extra)

    found = validating.dynamic_validate(rasp_program, list(tokens[1:]))
    return list(dict.fromkeys(f"{u.expr.label}: {str(u.reason).rstrip('.')}" for u in found))


def check_agreement(program: Any, inputs: Sequence[Sequence], outputs: Sequence[Sequence]) -> int:
    """Raise where the program's network disagrees with the program on one of ``inputs``
    (BOS first; ``outputs``: the program's, e.g. ``truth.output``), naming the first such
    input, the position, both outputs and tracr's reason; return the number of inputs
    checked.

    Raises:
        InvalidArgumentError: the network's output differs from the program's, or tracr's
            dynamic validation rejects the program on an input.
    """
    model = program.model
    groups: dict[int, list[int]] = {}
    for i, row in enumerate(inputs):
        groups.setdefault(len(row), []).append(i)
    decoded: dict[int, list] = {}
    with torch.no_grad():
        for ids in groups.values():
            out = decode(model, model(encode(model, [inputs[i] for i in ids])))
            for i, row in zip(ids, [out] if len(ids) == 1 else out, strict=True):
                decoded[i] = row
    for i, row in enumerate(inputs):
        q = first_difference(decoded[i], outputs[i])
        reasons = tracr_reasons(program, row)
        if q is None and not reasons:
            continue
        what = (f"at position {q} the network outputs {decoded[i][q]!r}, the program "
                f"{outputs[i][q]!r}" if q is not None else "the network happens to agree there")
        why = (f"tracr's validation: {'; '.join(reasons)}" if reasons else
               "the compiled network does not compute the program there")
        raise InvalidArgumentError(
            f"{program.name}: the compiled network disagrees with the RASP program on input "
            f"{i} of {len(inputs)}, {list(row)!r}: {what} ({why}). Its truth would not "
            "describe the network, so it is not scored: rewrite the operation in what tracr "
            "compiles exactly (a categorical Aggregate moves one value: a selector of width "
            "at most 1; a numerical Aggregate averages a 0/1 variable).")
    return len(inputs)
