"""Compiling a RASP program with tracr, keeping what the compiler knows: which attention
head and which MLP computes which part of the program.

:func:`compile_program` runs the steps of tracr's ``compile_rasp_to_model``
(``tracr/compiler/compiling.py``, Apache-2.0, DeepMind) one by one, so that the
compiled graph (the program's operations, each with the craft block that computes it)
is kept beside the weights; :func:`placements` maps every attention operation
(``Aggregate``, ``SelectorWidth``) to its (layer, head) of the converted model and every
MLP operation (``Map``, ``SequenceMap``, the MLP half of ``SelectorWidth``) to its layer.
Needs the tracr extra (imported inside the functions).
"""

from dataclasses import dataclass
from typing import Any

import numpy as np

from cwlens.errors import InvalidArgumentError
from cwlens.groundtruth.convert import require_tracr

PAD = "compiler_pad"
# The longest max_seq_len cwlens compiles (scripts/compile_time_by_length.py, on the
# project's shared 2-core CPU: reverse, sort, hist and shift_by compile at 32 in 18-59 s and
# at most 0.72 GB peak, jax's import included; reverse at 64 ran past 5 minutes; 10**9 dies
# in tracr with a MemoryError).
MAX_SEQ_LEN = 32
GROWTH = "reverse compiles at 32 in about 20 s, at 64 in more than 5 minutes; 10**9 runs out of memory"


@dataclass(frozen=True)
class Placement:
    """Where one operation of the program runs in the converted model.

    ``node`` is the operation's position in ``extract_rasp_graph(program).graph.nodes``
    (deterministic for a program, unlike its label, which counts every RASP expression
    the process made); ``kind`` is ``"aggregate"``, ``"selector_width"`` (attention) or
    ``"mlp"``; ``head`` is None for an MLP."""

    node: int
    kind: str
    layer: int
    head: int | None
    numerical: bool = False

    def to_json(self) -> dict:
        return {"node": self.node, "kind": self.kind, "layer": self.layer, "head": self.head,
                "numerical": self.numerical}

    @classmethod
    def from_json(cls, d: dict) -> "Placement":
        return cls(int(d["node"]), str(d["kind"]), int(d["layer"]),
                   None if d["head"] is None else int(d["head"]), bool(d.get("numerical", False)))


def compile_program(program: Any, vocab: set, max_seq_len: int, bos: str = "BOS",
                    causal: bool = False) -> tuple[Any, list[Placement]]:
    """``(assembled, placements)``: tracr's compiled model of ``program`` and where each
    of its operations runs.

    Raises:
        InvalidArgumentError: tracr cannot compile the program (its message is kept), or
            ``vocab``/``max_seq_len``/``bos`` are not what tracr takes (``max_seq_len`` at
            most :data:`MAX_SEQ_LEN`).
        ModelNotAvailableError: tracr is not installed.
    """
    require_tracr("compiling a RASP program")
    # optional: tracr (the tracr extra)
    from tracr.compiler import (
        basis_inference,
        craft_graph_to_model,
        craft_model_to_transformer,
        expr_to_craft_graph,
        rasp_to_graph,
        validating,
    )
    from tracr.craft import bases
    from tracr.rasp import rasp

    if not isinstance(program, rasp.SOp):
        raise InvalidArgumentError(
            f"program must be a RASP SOp (e.g. tracr.compiler.lib.make_reverse(rasp.tokens)); "
            f"got {type(program).__name__}.")
    vocab = check_vocab(vocab, bos)
    check_max_seq_len(max_seq_len)
    unsupported = validating.static_validate(program)
    if unsupported:
        reasons = "; ".join(f"{u.expr.name}: {u.reason}" for u in unsupported)
        raise InvalidArgumentError(
            f"tracr cannot compile this program: {reasons}. Rewrite those operations in the "
            "RASP subset tracr supports (tracr/compiler/validating.py; e.g. a categorical "
            "Aggregate needs a selector that picks at most one key, or keys of one value).")
    try:
        extracted = rasp_to_graph.extract_rasp_graph(program)
        graph, sources, sink = extracted.graph, extracted.sources, extracted.sink
        basis_inference.infer_bases(graph, sink, vocab, max_seq_len)
        expr_to_craft_graph.add_craft_components_to_rasp_graph(
            graph, bos_dir=bases.BasisDirection(rasp.tokens.label, bos), mlp_exactness=100)
        craft_model = craft_graph_to_model.craft_graph_to_model(graph, sources)
        assembled = craft_model_to_transformer.craft_model_to_transformer(
            craft_model=craft_model, graph=graph, sink=sink, max_seq_len=max_seq_len,
            causal=causal, compiler_bos=bos, compiler_pad=PAD)
    except (NotImplementedError, ValueError, KeyError, TypeError, AssertionError) as err:
        raise InvalidArgumentError(
            f"tracr cannot compile this program: {type(err).__name__}: {err}. Check that "
            "every operation's values stay in the vocabulary you gave (basis inference runs "
            "the program's functions on every value) and that it uses the RASP subset tracr "
            "supports (tracr/compiler/validating.py).") from err
    return assembled, placements(graph, sources, craft_model)


def check_max_seq_len(max_seq_len: Any) -> int:
    """``max_seq_len``, or the error: a positive int of at most :data:`MAX_SEQ_LEN`."""
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1:
        raise InvalidArgumentError(
            f"max_seq_len must be a positive int (the longest input after the BOS); got "
            f"{max_seq_len!r:.60}.")
    if max_seq_len > MAX_SEQ_LEN:
        raise InvalidArgumentError(
            f"max_seq_len {max_seq_len} is beyond what cwlens compiles, {MAX_SEQ_LEN}: tracr's "
            f"model grows with it ({GROWTH}), and the ground truth tries every token at every "
            f"position. Pass max_seq_len <= {MAX_SEQ_LEN}.")
    return max_seq_len


def check_vocab(vocab: Any, bos: str) -> set:
    """``vocab`` as a set, or the error (not a collection, empty, unhashable tokens, the
    BOS or tracr's pad token in it)."""
    if isinstance(vocab, str) or not hasattr(vocab, "__iter__"):
        raise InvalidArgumentError(
            f"vocab must be a set of tokens, e.g. {{'a', 'b', 'c'}}; got {vocab!r:.60}.")
    try:
        vocab = set(vocab)
    except TypeError as err:
        bad = next((t for t in vocab if getattr(t, "__hash__", None) is None), None)
        raise InvalidArgumentError(
            f"vocab holds {bad!r:.40}, a {type(bad).__name__}, which is unhashable: tokens are "
            "hashable values (str, int, ...), e.g. vocab = {'a', 'b', 'c'}.") from err
    if not vocab:
        raise InvalidArgumentError("vocab is empty: give the tokens inputs may hold, e.g. {'a', 'b'}.")
    for special in (bos, PAD):
        if special in vocab:
            raise InvalidArgumentError(
                f"vocab holds {special!r}, which tracr reserves (the BOS and pad tokens): "
                "remove it from vocab, or name the BOS otherwise.")
    return vocab


def placements(graph: Any, sources: Any, craft_model: Any) -> list[Placement]:
    """Where each operation of a compiled graph runs (see :class:`Placement`)."""
    # optional: tracr (the tracr extra)
    from tracr.compiler import assemble, craft_graph_to_model, nodes
    from tracr.craft import transformers
    from tracr.rasp import rasp

    allocation = craft_graph_to_model._allocate_modules_to_layers(graph, sources)
    _, names = assemble._get_model_config_and_module_names(craft_model)
    # craft layers (attention even, MLP odd) that hold blocks, in order = craft_model.blocks
    used = sorted({no for nid, no in allocation.items() if _block(graph.nodes[nid]) is not None} |
                  {no + 1 for nid, no in allocation.items()
                   if isinstance(_block(graph.nodes[nid]), transformers.SeriesWithResiduals)})
    layer_of = {no: int(name.split("_")[1].split("/")[0]) for no, name in zip(used, names, strict=True)}
    heads: dict[int, tuple[int, int]] = {}
    for name, block in zip(names, craft_model.blocks, strict=True):
        if name.endswith("attn"):
            for i, head in enumerate(block.as_multi().heads()):
                heads[id(head)] = (int(name.split("_")[1].split("/")[0]), i)
    out = []
    for position, (nid, node) in enumerate(graph.nodes.items()):
        block = _block(node)
        if block is None:
            continue
        expr = node[nodes.EXPR]
        numerical = isinstance(expr, rasp.SOp) and rasp.is_numerical(expr)
        if isinstance(block, transformers.SeriesWithResiduals):  # SelectorWidth: attn + MLP
            attn, _ = block.blocks
            for head in attn.as_multi().heads():
                out.append(Placement(position, "selector_width", *heads[id(head)], numerical))
            out.append(Placement(position, "mlp", layer_of[allocation[nid] + 1], None, numerical))
        elif isinstance(block, transformers.AttentionHead | transformers.MultiAttentionHead):
            for head in block.as_multi().heads():
                out.append(Placement(position, "aggregate", *heads[id(head)], numerical))
        else:
            out.append(Placement(position, "mlp", layer_of[allocation[nid]], None, numerical))
    return out


def _block(node: dict) -> Any:
    from tracr.compiler import nodes  # optional: tracr (the tracr extra)

    return node.get(nodes.MODEL_BLOCK)


def tracr_reference(assembled: Any, inputs: list[list]) -> list[tuple[Any, list]]:
    """Tracr's own run of each input: ``(residuals [2 * n_layers, n, d_model], decoded)``,
    the residual after every attention and every MLP block (``apply(...).residuals``; the
    last is the output the unembedding reads, tracr has no final norm) and
    ``apply(...).decoded``. The forward pass is jit-compiled once per input length
    (``assembled.apply`` traces it on every call: ~1 s each)."""
    import jax  # optional: tracr (the tracr extra)

    forward = jax.jit(assembled.forward)
    out = []
    for tokens in inputs:
        ids = np.array([assembled.input_encoder.encode(list(tokens))])
        result = forward(assembled.params, ids)
        residuals = np.stack([np.asarray(r[0]) for r in result.transformer_output.residuals])
        decoded = np.asarray(result.unembedded_output[0]).tolist()
        if assembled.output_encoder is not None:
            decoded = assembled.output_encoder.decode(decoded)
        out.append((residuals, [assembled.input_encoder.bos_token, *decoded[1:]]))
    return out
