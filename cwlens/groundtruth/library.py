"""Compiled programs: the shipped ones (:func:`names`, :func:`load`) and a user's own
(:func:`from_file`), each a :class:`CompiledProgram` (model, vocabulary, RASP source,
input sampler, ground truth).

A program file defines ``program`` (a RASP SOp), ``vocab`` (a set of tokens) and
``max_seq_len``; optionally ``description``, ``sample_inputs(n, seed)`` (a list of inputs,
each a list of tokens without the BOS or with it) or ``sampling`` (``{"distinct": True}``:
no token twice in an input; ``"min_length"``/``"max_length"``: the lengths drawn after
the BOS, 1..max_seq_len by default). The shipped programs live in
``cwlens/groundtruth/programs/``: ``<name>.py`` (the source), ``<name>.json`` and
``<name>.npz`` (weights, layout, placements, the truth of ``sample_inputs(256, seed=0)``
and tracr's own residuals on a few inputs), written by ``python
scripts/compile_groundtruth.py`` (needs tracr); loading them needs no jax.
"""

import ast
import json
import random
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cwlens.engine.handle import ModelHandle, wrap
from cwlens.engine.models.tracr_network import TracrTransformer
from cwlens.errors import InvalidArgumentError, ModelNotAvailableError, UnknownOptionError
from cwlens.groundtruth import codec
from cwlens.groundtruth.compiler import Placement, check_max_seq_len, check_vocab, compile_program
from cwlens.groundtruth.convert import INSTALL, TracrLayout, build, from_tracr, require_tracr
from cwlens.groundtruth.truth import Truth, compute, unpack

PROGRAMS = Path(__file__).parent / "programs"
FORMAT = "cwlens-groundtruth/1"
SHIPPED_INPUTS = (256, 0)  # the shipped truth: sample_inputs(256, seed=0)


def sorted_vocab(vocab: Any) -> tuple:
    return tuple(sorted(vocab, key=lambda v: (type(v).__name__, v)))


@dataclass(frozen=True)
class CompiledProgram:
    """A RASP program compiled by tracr, as a cwlens model with its ground truth.

    Attributes:
        name: the program's name.
        model: the converted model (:class:`~cwlens.engine.models.tracr_network.TracrTransformer`).
        vocab: the input tokens (without the BOS).
        max_seq_len: the longest input after the BOS.
        bos: the BOS token.
        source: the RASP source text.
        description: what the program computes.
        components: ``("attn", layer, head)`` and ``("mlp", layer)`` that compute the
            program (the compiled graph); every other head and MLP is zero.
        placements: where each operation runs (:class:`~cwlens.groundtruth.compiler.Placement`).
        sampling: the input sampler's options (``distinct``, ``min_length``, ``max_length``).
    """

    name: str
    model: TracrTransformer
    vocab: tuple
    max_seq_len: int
    bos: str
    source: str
    description: str
    components: frozenset
    placements: tuple = ()
    sampling: dict = field(default_factory=dict)
    _shipped: dict = field(default_factory=dict, repr=False, compare=False)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def handle(self) -> ModelHandle:
        """The compiled model's handle (:func:`cwlens.wrap`, cached on the model)."""
        return wrap(self.model)

    def sample_inputs(self, n: int, seed: int = 0) -> list[list]:
        """``n`` random inputs, each BOS first (the program's own sampler where its file
        has one; else tokens drawn uniformly, lengths 1..max_seq_len after the BOS)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidArgumentError(f"n must be an int >= 0 (how many inputs); got {n!r}.")
        sampler = self._cache.get("sampler")
        if sampler is not None:
            rows = [list(r) for r in sampler(n, seed)]
            return [r if r[:1] == [self.bos] else [self.bos, *r] for r in rows]
        rng = random.Random(seed)
        low = int(self.sampling.get("min_length", 1))
        high = int(self.sampling.get("max_length", self.max_seq_len))
        distinct = bool(self.sampling.get("distinct", False))
        rows = []
        for _ in range(n):
            length = rng.randint(low, high)
            tokens = rng.sample(self.vocab, length) if distinct else [rng.choice(self.vocab) for _ in range(length)]
            rows.append([self.bos, *tokens])
        return rows

    def truth(self, inputs: list[list]) -> list[Truth]:
        """The :class:`~cwlens.groundtruth.truth.Truth` of each input (BOS first).

        With tracr installed, computed for any input with tracr's RASP evaluator; without
        it, the shipped programs answer for the inputs of ``sample_inputs(256, seed=0)``.

        Raises:
            InvalidArgumentError / InputTooLongError: an input the program cannot take
                (a token outside the vocabulary, no BOS first, too long).
            ModelNotAvailableError: tracr is not installed and an input is not one whose
                truth was shipped.
        """
        if isinstance(inputs, str) or not isinstance(inputs, list | tuple):
            raise InvalidArgumentError(
                f"truth takes a list of inputs (each a list of tokens, BOS first); got "
                f"{type(inputs).__name__}.")
        known = self.model.tokenizer.tokens
        keys = [tuple(known[i] for i in codec.check_input(self.model, t)) for t in inputs]
        missing = [k for k in keys if k not in self._shipped]
        if missing:
            program = self._program(f"the truth of {list(missing[0])!r} (not among the shipped inputs)")
            handle = self.handle
            for k in missing:
                self._shipped[k] = compute(program, list(k), self.vocab, list(self.placements),
                                           handle.n_layers, handle.n_heads)
        return [self._shipped[k] for k in keys]

    def _program(self, what: str) -> Any:
        """The RASP program (its source run once; needs tracr)."""
        if "program" not in self._cache:
            require_tracr(what)
            self._cache["program"] = _run_source(self.source, self.name)["program"]
        return self._cache["program"]


def names() -> list[str]:
    """The shipped programs' names (``cwlens.groundtruth.load(name)`` loads one).

    Returns:
        The names, sorted.

    Examples:
        >>> from cwlens import groundtruth
        >>> "frac_prevs" in groundtruth.names()
        True
    """
    return sorted(p.stem for p in PROGRAMS.glob("*.json"))


def load(name: str) -> CompiledProgram:
    """A shipped program (:func:`names`), from its files; needs no jax or tracr.

    Args:
        name: one of :func:`names` (``"reverse"``, ``"frac_prevs"``, ...).

    Returns:
        The compiled program (:class:`CompiledProgram`): its ``model`` (every cwlens function takes it), its
        inputs (``sample_inputs``) and their truth (``truth``), its ``components``.

    Raises:
        UnknownOptionError: no shipped program of that name (the message lists them).

    Examples:
        >>> import cwlens
        >>> from cwlens import groundtruth
        >>> program = groundtruth.load("frac_prevs")
        >>> tokens = groundtruth.encode(program.model, ["BOS", "x", "w", "x"])
        >>> logits, cache = cwlens.run_with_cache(program.model, tokens)
        >>> [round(v, 3) for v in groundtruth.decode(program.model, logits)[1:]]
        [1.0, 0.5, 0.667]
        >>> truth = program.truth(program.sample_inputs(1, seed=0))[0]
        >>> handle = cwlens.wrap(program.model)
        >>> truth.movement.shape[:2] == (handle.n_layers, handle.n_heads)
        True
    """
    if not isinstance(name, str) or name not in names():
        raise UnknownOptionError(
            f"no shipped program {name!r}: the shipped ones are {names()}. A program of your "
            "own: cwlens.groundtruth.from_file('my_program.py') (needs the tracr extra).")
    meta = json.loads((PROGRAMS / f"{name}.json").read_text())
    if meta.get("format") != FORMAT:
        raise InvalidArgumentError(
            f"{PROGRAMS / name}.json has format {meta.get('format')!r}, not {FORMAT!r}: "
            "rebuild it with python scripts/compile_groundtruth.py --program " + name)
    with np.load(PROGRAMS / f"{name}.npz") as z:
        arrays = {k: z[k] for k in z.files}
    weights = {k[len("w."):]: v for k, v in arrays.items() if k.startswith("w.")}
    model = build(weights, TracrLayout.from_json(meta["layout"]), name)
    truth = {k[len("truth."):]: v for k, v in arrays.items() if k.startswith("truth.")}
    inputs = [list(r) for r in meta["inputs"]]
    handle = wrap(model)
    truths = unpack(truth, inputs, meta["outputs"], handle.n_layers, handle.n_heads)
    return CompiledProgram(
        name, model, tuple(meta["vocab"]), int(meta["max_seq_len"]), meta["bos"],
        (PROGRAMS / f"{name}.py").read_text(), meta["description"],
        frozenset(tuple(c) for c in meta["components"]),
        tuple(Placement.from_json(p) for p in meta["placements"]), dict(meta.get("sampling", {})),
        {tuple(t.tokens): t for t in truths})


def read_file(path: str | Path) -> dict[str, Any]:
    """The names a program file defines (it is run: it imports tracr), checked."""
    path = Path(path)
    if not path.is_file():
        raise InvalidArgumentError(
            f"no program file {str(path)!r}: pass a Python file that defines program, vocab and "
            "max_seq_len (see cwlens/groundtruth/programs/ for examples).")
    require_tracr(f"the program file {path}")
    source = path.read_text()
    return _checked(_run_source(source, str(path)), str(path), source)


def _run_source(source: str, where: str) -> dict[str, Any]:
    """The names ``source`` defines, run as the file ``where`` (tracebacks and errors name
    that file and its lines). A syntax error or a statement that raises is one
    :class:`InvalidArgumentError` naming the file, the line and the message."""
    try:
        code = compile(source, where, "exec")
    except SyntaxError as err:
        raise InvalidArgumentError(
            f"{where}, line {err.lineno}: SyntaxError: {err.msg}: fix the program file (it "
            "must be Python that defines program, vocab and max_seq_len).") from err
    names: dict[str, Any] = {"__name__": "cwlens_program", "__file__": where,
                             "__builtins__": __builtins__}
    try:
        exec(code, names)  # noqa: S102 -- running the user's program file is what is asked
    except ImportError as err:
        if "tracr" in str(err) or "jax" in str(err) or "haiku" in str(err):
            raise ModelNotAvailableError(
                f"{where} needs tracr, which is not installed: {INSTALL}.") from err
        raise _statement_error(err, where) from err
    except Exception as err:
        raise _statement_error(err, where) from err
    return names


def _statement_error(err: BaseException, where: str) -> InvalidArgumentError:
    """``err``, raised while running the program file ``where``, as one error naming the
    file's line that raised it (the last frame of the traceback in that file)."""
    lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if f.filename == where]
    line = f", line {lines[-1]}" if lines else ""
    return InvalidArgumentError(
        f"{where}{line}: {type(err).__name__}: {' '.join(str(err).split())}: running the "
        "program file raised this; fix that statement.")


def _line_of(source: str, name: str) -> str:
    """``", line N"``: where ``source`` last assigns ``name`` at its top level ('' if not found)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    found = [node.lineno for node in tree.body if isinstance(node, ast.Assign | ast.AnnAssign)
             and any(isinstance(t, ast.Name) and t.id == name
                     for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))]
    return f", line {found[-1]}" if found else ""


def _checked(names: dict[str, Any], where: str, source: str = "") -> dict[str, Any]:
    from tracr.rasp import rasp  # optional: tracr (the tracr extra)

    missing = [n for n in ("program", "vocab", "max_seq_len") if n not in names]
    if missing:
        defined = sorted(n for n in names if not n.startswith("_"))
        raise InvalidArgumentError(
            f"{where} defines no {', '.join(missing)} (it defines {defined[:12]}): a program "
            "file defines program (a RASP SOp), vocab (a set of tokens) and max_seq_len (an "
            "int), e.g. program = tracr.compiler.lib.make_reverse(rasp.tokens).")
    if not isinstance(names["program"], rasp.SOp):
        raise InvalidArgumentError(
            f"{where}{_line_of(source, 'program')}: program is a "
            f"{type(names['program']).__name__}, not a RASP SOp: define program = <an SOp>, "
            "e.g. tracr.compiler.lib.make_hist().")
    for name, check in (("vocab", lambda: check_vocab(names["vocab"], str(names.get("bos", "BOS")))),
                        ("max_seq_len", lambda: check_max_seq_len(names["max_seq_len"]))):
        try:
            check()
        except InvalidArgumentError as err:
            raise type(err)(f"{where}{_line_of(source, name)}: {err}") from err
    return names


def from_file(path: str | Path, name: str | None = None) -> CompiledProgram:
    """Compile a user's RASP program file (see the module docstring) into a
    :class:`CompiledProgram`; needs the tracr extra. Its truth is computed on demand.

    Args:
        path: a Python file defining ``program``, ``vocab`` and ``max_seq_len`` (and
            optionally ``description``, ``sample_inputs(n, seed)`` or ``sampling``).
        name: the program's name (default: the file's stem).

    Returns:
        The compiled program (:class:`CompiledProgram`; compiled here: seconds to minutes).

    Raises:
        InvalidArgumentError: no such file, a file that defines no ``program`` (or no
            ``vocab``/``max_seq_len``), a syntax error or a statement that raises (the
            message names the file and its line), an unhashable ``vocab``, a
            ``max_seq_len`` above :data:`cwlens.groundtruth.compiler.MAX_SEQ_LEN` (32), or
            a program tracr cannot compile.
        ModelNotAvailableError: tracr is not installed (``pip install "cwlens[tracr]"``).

    Examples:
        >>> from cwlens import groundtruth
        >>> program = groundtruth.from_file("my_program.py")  # doctest: +SKIP
    """
    path = Path(path)
    defined = read_file(path)
    return from_definitions(defined, name or path.stem, path.read_text())


def from_definitions(defined: dict[str, Any], name: str, source: str) -> CompiledProgram:
    """A :class:`CompiledProgram` of a program file's names (compiles: needs tracr)."""
    bos = str(defined.get("bos", "BOS"))
    assembled, placements = compile_program(defined["program"], defined["vocab"],
                                            defined["max_seq_len"], bos)
    model = from_tracr(assembled, name)
    program = CompiledProgram(
        name, model, sorted_vocab(defined["vocab"]), int(defined["max_seq_len"]), bos, source,
        str(defined.get("description") or (defined.get("__doc__") or name).strip().splitlines()[0]),
        components_of(placements), tuple(placements), dict(defined.get("sampling") or {}))
    program._cache["program"] = defined["program"]
    if callable(defined.get("sample_inputs")):
        program._cache["sampler"] = defined["sample_inputs"]
    program._cache["assembled"] = assembled
    return program


def components_of(placements: list[Placement]) -> frozenset:
    """``("attn", layer, head)`` and ``("mlp", layer)`` of the placements."""
    return frozenset(("mlp", p.layer) if p.head is None else ("attn", p.layer, p.head)
                     for p in placements)
