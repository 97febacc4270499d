"""The compiled programs scored against the graded per-edge truth: on each input, the
query is the last position and the objective the raw logit of the decoded output there
(``objective="logit"``: a categorical program's output token, a numerical program's
output value). tracr's zero-weight padding heads (:mod:`cwlens.groundtruth.padding`) are
left out of every score: their edges are marked absent before scoring.

Unlike the movement truth (any value-aware measure scores 1.00 against it by
construction, docs/groundtruth.md), this truth is graded: it says how much each moved
value matters to the output, so the methods can disagree with it."""

from collections.abc import Sequence

from cwlens.groundtruth.codec import encode
from cwlens.groundtruth.edge_methods import EDGE_METHODS, method_weights
from cwlens.groundtruth.edge_study import EdgeInput, record_of
from cwlens.groundtruth.edges import edge_effects
from cwlens.groundtruth.padding import padding_heads


def program_records(program, n_inputs: int, seed: int = 0,
                    methods: Sequence[str] = EDGE_METHODS) -> list[dict]:
    """One record (:func:`cwlens.groundtruth.edge_study.record_of`) per input of
    ``program.sample_inputs(n_inputs, seed)``."""
    handle = program.handle
    padding = padding_heads(program)
    records = []
    for i, inp in enumerate(program.sample_inputs(n_inputs, seed)):
        tokens = encode(handle, inp)[0]
        fx = edge_effects(handle, tokens, query=-1, objective="logit")
        fx.alpha[padding[fx.layers]] = 0.0  # padding heads: no edge of the program
        fx.effect[padding[fx.layers]] = 0.0
        weights = method_weights(handle, fx, methods)
        records.append(record_of(handle, EdgeInput(f"{program.name}-{i:04d}", tokens), fx, weights))
    return records
