"""The causal truth per attention edge: what removing one term ``a_ij^h v~_j^h`` does to
the prediction at query ``i``, measured exactly, for every head and key of chosen layers.

An edge ``(l, h, j)`` at query ``i``: subtract ``a_ij^h v~_j^h`` (with GQA, the head's own
key/value group) from head ``h``'s attention output at position ``i`` only, in layer ``l``,
run the rest of the model, and take ``effect = objective(clean) - objective(ablated)``
(the paper's value masking, for one entry). Positive: the edge supports the objective.

Objectives (``objective=``), each a number read from the logits at query ``i``:

``"logprob"`` (default)
    ``log p(t)`` of ``target`` (default: the clean run's top-1 next token).
``"logit"``
    the raw logit of ``target`` (default: the clean top-1): a compiled program's decoded
    output (:mod:`cwlens.groundtruth`), a numerical program's output value itself.
``"logit_diff"``
    ``logit(a) - logit(b)`` of ``target=(a, b)`` (IOI: the indirect object minus the
    subject).
``"kl"``
    ``-KL(p_clean || p_ablated)`` of the next-token distribution, so ``effect =
    KL(p_clean || p_ablated) >= 0``: how much the edge's removal moves the distribution,
    unsigned.
``"nll"``
    ``log p`` of the *true* next token (the input's token at ``i + 1``), so ``effect =
    NLL(ablated) - NLL(clean)``: the loss the edge's removal adds.
``"embedding"`` (encoders)
    ``cos(e, e_clean)`` of the sentence embedding ``e`` (the last hidden state, mean-pooled
    over the positions, as sentence-transformers does), so ``effect = 1 - cos(e_ablated,
    e_clean) >= 0``: the damage of :mod:`cwlens.faithfulness.encoder`, unsigned. For an
    encoder without a masked-LM head (all-MiniLM-L6-v2: its logits are a head nobody
    trained) the only meaningful one.

Encoders (bidirectional): the query is a masked position and the logit objectives read
that position's prediction (``target`` is then required for ``"nll"``); ``"embedding"``
reads the whole sentence's.

How it runs (:mod:`cwlens.engine.interventions.edge_removal`): a causal decoder on
TransformerLens 4.x carries only the query's position, from the edge's layer on, over the
clean keys and values of the positions before it (``path="prefix"``); anything else runs
the whole input once per edge, batched (``path="full"``). Both give the same numbers
(tested). Edges with ``a_ij = 0`` exactly (keys outside a sliding window, padding) remove
nothing: their effect is 0 without a run.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch

from cwlens.core import edge_scoring
from cwlens.engine import adapter, hook_names
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle, wrap
from cwlens.engine.interventions.edge_removal import (
    Edits,
    PrefixRunner,
    full_rows,
    softmax_in_model_dtype,
    supports_prefix,
)
from cwlens.errors import InvalidArgumentError, UnknownOptionError

Objective = Literal["logprob", "logit", "logit_diff", "kl", "nll", "embedding"]
UNSIGNED = ("kl", "embedding")  # effect >= 0: no direction, no gradient at the clean point
OBJECTIVES: tuple[str, ...] = get_args(Objective)
Path = Literal["auto", "prefix", "full"]
ROWS = {"prefix": 320, "full": 16}  # ablated copies per forward: one position vs the whole input


@dataclass
class EdgeEffects:
    """The true effect of every edge of the chosen layers at one query.

    Attributes:
        effect: ``[layer, head, key]`` float64, ``objective(clean) - objective(ablated)``
            (layers in the order of :attr:`layers`; keys ``0..query`` for a decoder, every
            position for an encoder).
        alpha: ``[layer, head, key]`` the clean attention at the query (an edge with
            ``alpha == 0`` does not exist: :attr:`eligible` leaves it out of every score).
        layers: the model layers of ``effect``'s first axis.
        query: the query position (non-negative).
        objective: the objective's name; ``clean``: its value in the clean run.
        target: the token(s) it reads (``None`` for ``"kl"`` and ``"embedding"``).
        tokens: ``[pos]`` the input's token ids (up to the query for a decoder).
        path: how the rows ran (``"prefix"`` or ``"full"``).
        dtype: the dtype the model ran in.
    """

    effect: torch.Tensor
    alpha: torch.Tensor
    layers: list[int]
    query: int
    objective: str
    clean: float
    target: Any
    tokens: torch.Tensor
    path: str
    dtype: torch.dtype
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def eligible(self) -> torch.Tensor:
        """``[layer, head, key]`` True where the edge exists (``alpha > 0``)."""
        return self.alpha > 0

    @property
    def n_edges(self) -> int:
        return int(self.eligible.sum())

    def score(self, weights: torch.Tensor | dict[str, torch.Tensor],
              ks: Sequence[int] = edge_scoring.KS) -> dict:
        """Each layer's agreement of ``weights`` (``[layer, head, key]`` like
        :attr:`effect`, or ``{method: weights}``) with the true effects, over the layer's
        existing edges: :func:`cwlens.core.edge_scoring.agreement` per layer (Spearman of
        magnitudes and of signed values, top-k recall, the captured share of the top-k
        true |effect|). Returns ``{layer: {...}}`` or ``{method: {layer: {...}}}``."""
        if isinstance(weights, dict):
            return {name: self.score(w, ks) for name, w in weights.items()}
        if tuple(weights.shape) != tuple(self.effect.shape):
            raise InvalidArgumentError(
                f"weights {tuple(weights.shape)} must be shaped like the effects "
                f"{tuple(self.effect.shape)} [layer, head, key]")
        out = {}
        for i, layer in enumerate(self.layers):
            ok = self.eligible[i]
            out[layer] = edge_scoring.agreement(weights[i][ok].double(), self.effect[i][ok], ks)
        return out

    def __repr__(self) -> str:
        top = self.effect.abs().flatten().argmax()
        li, h, k = (int(x) for x in torch.unravel_index(top, self.effect.shape))
        return (f"EdgeEffects({self.objective} at query {self.query}, {len(self.layers)} layers x "
                f"{self.effect.shape[1]} heads x {self.effect.shape[2]} keys, {self.n_edges} edges; "
                f"largest |effect| {float(self.effect[li, h, k]):+.4g} at L{self.layers[li]}H{h} "
                f"key {k}; path {self.path}, {str(self.dtype).replace('torch.', '')})")


# -- inputs ----------------------------------------------------------------------------------
def tokens_of(handle: ModelHandle, input: Any) -> torch.Tensor:
    """``[1, pos]`` token ids of a text or of ``[pos]`` / ``[1, pos]`` ids."""
    if isinstance(input, str):
        tokens = handle.to_tokens(input)
    elif isinstance(input, torch.Tensor) and not input.is_floating_point() and input.ndim in (1, 2):
        tokens = input[None] if input.ndim == 1 else input
    else:
        raise InvalidArgumentError(
            f"edge_effects takes one text or the token ids of one input ([pos] or [1, pos]); "
            f"got {type(input).__name__}{tuple(getattr(input, 'shape', ()))}. For several "
            "inputs, call it once per input (or use `cwlens groundtruth --edges`).")
    if tokens.shape[0] != 1:
        raise InvalidArgumentError(
            f"edge_effects takes one input; got a batch of {tokens.shape[0]}. Call it once "
            "per input.")
    return tokens.to(handle.device)


def resolve_query(query: int, n: int) -> int:
    if isinstance(query, bool) or not isinstance(query, int):
        raise InvalidArgumentError(f"query must be an int position; got {query!r}")
    q = query + n if query < 0 else query
    if not 0 <= q < n:
        raise InvalidArgumentError(
            f"query {query} is outside the input's {n} positions (0..{n - 1}, or -1 for the last)")
    return q


@takes_model
def model_in(model: ModelLike, dtype: torch.dtype) -> Any:
    """The TransformerLens model itself (given the model or its handle) where its weights
    are ``dtype``, else a copy in ``dtype`` (float32 weights are exact in float64): cached on
    the model's handle, so a loop over inputs copies once (:func:`handle_in`)."""
    return handle_in(model, dtype).model


def handle_in(handle: ModelHandle, dtype: torch.dtype) -> ModelHandle:
    """``handle`` itself where its model's weights are ``dtype``, else the handle of a copy
    in ``dtype`` (float32 weights are exact in float64), cached on ``handle``: a loop over
    inputs copies (and wraps the copy) once."""
    param = next(handle.model.parameters(), None)
    if param is None or param.dtype == dtype:
        return handle
    cached = getattr(handle, "_edge_copies", {})
    if dtype not in cached:
        copied = copy.deepcopy(handle.model).to(dtype)  # one copy at a time
        cached = {dtype: wrap(copied)}  # a new model: its handle is made here, once
        handle._edge_copies = cached  # type: ignore[attr-defined]
    return cached[dtype]


# -- objectives --------------------------------------------------------------------------------
class Reader:
    """The objective as a function of the logits at the query (``[rows, d_vocab]`` ->
    ``[rows]`` float64)."""

    def __init__(self, objective: str, target: Any, clean_logits: torch.Tensor | None = None):
        self.objective = objective
        self.target = target
        self.clean_logp = None
        if clean_logits is not None and objective == "kl":
            self.clean_logp = clean_logits.double().log_softmax(-1)
        if objective == "embedding":
            if clean_logits is None:
                raise InvalidArgumentError("objective 'embedding' needs the clean last hidden state "
                                           "[1, pos, d_model]: Reader('embedding', None, clean_hidden)")
            self.clean_embedding = clean_logits.double().mean(1)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.objective == "embedding":  # the last hidden state [rows, pos, d_model]
            e = logits.double().mean(1)
            return torch.nn.functional.cosine_similarity(e, self.clean_embedding.to(e.device), dim=-1)
        if self.objective in ("logprob", "nll"):
            return log_prob(logits, int(self.target))
        if self.objective == "logit":
            return logits[:, int(self.target)].double()
        if self.objective == "logit_diff":
            a, b = self.target
            return logits[:, int(a)].double() - logits[:, int(b)].double()
        logits = logits.double()
        if self.clean_logp is None:
            raise InvalidArgumentError("objective 'kl' needs the clean logits: Reader('kl', None, clean_logits)")
        logp = logits.log_softmax(-1)
        p = self.clean_logp.exp()
        return -(p * (self.clean_logp - logp)).sum(-1)


def log_prob(logits: torch.Tensor, target: int) -> torch.Tensor:
    """``[rows]`` float64: ``log softmax(logits)[:, target]``. A float64 input is read in
    float64. A float32 one is read around each row's largest logit ``m``: the exponentials
    and their sum in float32 (converting the logits to float64 took a quarter of an edge
    run), ``logit_target - m`` and ``log1p`` of the sum without the largest term in float64.
    Within ~1e-7 of the float64 reading of the same logits, and exact where the prediction
    is saturated (p ~ 1: a float32 log-sum-exp there rounds at ~1e-6, the size of the
    effects; tested)."""
    if logits.dtype == torch.float64:
        return logits[:, target] - logits.logsumexp(-1)
    m, at = logits.max(-1, keepdim=True)
    e = logits - m
    if logits.requires_grad:  # attention x gradient differentiates it: out of place
        rest = e.exp().scatter(1, at, 0.0).sum(-1)
    else:
        rest = e.exp_().scatter_(1, at, 0.0).sum(-1)
    return (logits[:, target].double() - m[:, 0].double()) - rest.double().log1p()


def _target(objective: str, target: Any, clean_logits, next_token: int | None, d_vocab: int) -> Any:
    def token(t: Any, what: str) -> int:
        if isinstance(t, bool) or not isinstance(t, int | torch.Tensor) or int(t) < 0 or int(t) >= d_vocab:
            raise InvalidArgumentError(f"{what} must be a token id in 0..{d_vocab - 1}; got {t!r}")
        return int(t)

    if objective in UNSIGNED:
        if target is not None:
            raise InvalidArgumentError(f"objective {objective!r} reads the whole distribution or "
                                       "embedding: pass no target")
        return None
    if objective == "logit_diff":
        if not (isinstance(target, tuple | list) and len(target) == 2):
            raise InvalidArgumentError(
                "objective 'logit_diff' needs target=(a, b): the logit of a minus that of b "
                "(IOI: the indirect object's token id, then the subject's)")
        return (token(target[0], "target[0]"), token(target[1], "target[1]"))
    if objective == "nll":
        if target is not None:
            return token(target, "target")
        if next_token is None:
            raise InvalidArgumentError(
                "objective 'nll' reads the true next token, but the query is the input's last "
                "position (or the model is an encoder): pass a query before the end, or "
                "target=<token id>")
        return next_token
    return token(target, "target") if target is not None else int(clean_logits.argmax())


# -- the measurement --------------------------------------------------------------------------
@takes_model
def edge_effects(
    model: ModelLike,
    input: Any,
    query: int = -1,
    target: Any = None,
    layers: Any = None,
    objective: str = "logprob",
    dtype: torch.dtype = torch.float64,
    path: str = "auto",
) -> EdgeEffects:
    """The true effect of removing each attention edge at ``query`` on the prediction there.

    Args:
        model: a TransformerLens model (TransformerBridge or HookedTransformer /
            HookedEncoder).
        input: one text, or its token ids ``[pos]`` / ``[1, pos]``.
        query: the query position (negative: from the end). A decoder's input is cut after
            it (later positions cannot change it).
        target: what the objective reads (see the module docstring): a token id for
            ``"logprob"`` (default: the clean top-1) and ``"nll"`` (default: the true next
            token), ``(a, b)`` for ``"logit_diff"``, nothing for ``"kl"``.
        layers: an int, a list or None (every layer).
        objective: ``"logprob"``, ``"logit"``, ``"logit_diff"``, ``"kl"``, ``"nll"`` or
            ``"embedding"`` (encoders).
        dtype: the dtype the model runs in (float64, the default, for exactness: a float32
            model is copied once into float64; float32 runs the model as it is).
        path: ``"prefix"`` (causal decoders on TransformerLens 4.x), ``"full"`` (any
            model, a whole forward per edge) or ``"auto"`` (prefix where it applies). Rows
            per forward: :data:`ROWS` of the path.

    Returns:
        The effects as :class:`EdgeEffects` (``.effect [layer, head, key]``, ``.score(weights)``).

    Examples:
        >>> import torch
        >>> from cwlens.groundtruth import edge_effects
        >>> from cwlens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> fx = edge_effects(model, torch.tensor([1, 5, 9, 3, 7]), query=-1)
        >>> tuple(fx.effect.shape)  # [layer, head, key]
        (2, 4, 5)
    """
    if objective not in OBJECTIVES:
        raise UnknownOptionError(f"Unknown objective={objective!r}. Valid: {', '.join(OBJECTIVES)}.")
    if path not in get_args(Path):
        raise UnknownOptionError(f"Unknown path={path!r}. Valid: auto, prefix, full.")
    if dtype not in (torch.float32, torch.float64):
        raise InvalidArgumentError(f"dtype must be torch.float32 or torch.float64; got {dtype!r}")
    resolved, _ = adapter.resolve_layers(model.n_layers, layers)
    tokens = tokens_of(model, input)
    n = tokens.shape[1]
    q = resolve_query(query, n)
    encoder = model.is_encoder
    if objective == "embedding" and not encoder:
        raise InvalidArgumentError(
            "objective 'embedding' reads an encoder's sentence embedding; a decoder's prediction "
            "is read by logprob, logit, logit_diff, kl or nll")
    next_token = int(tokens[0, q + 1]) if (not encoder and q + 1 < n) else None
    if not encoder:
        tokens = tokens[:, :q + 1]
    run = handle_in(model, dtype)
    why = supports_prefix(run)
    if path == "prefix" and why is not None:
        raise InvalidArgumentError(f"path='prefix' does not apply: {why}. Use path='full' or 'auto'.")
    use = "prefix" if (path == "prefix" or (path == "auto" and why is None)) else "full"

    with torch.no_grad(), softmax_in_model_dtype(run):
        names = set(run.info.hooks(resolved)) | {_read_hook(run, objective)}
        logits, cache = run.cached_run(tokens, names.__contains__)
        clean_logits = logits[0, q]
        tgt = _target(objective, target, clean_logits, next_token, int(clean_logits.shape[-1]))
        reader, read = _reader(objective, tgt, logits[:, q], cache, run)
        clean = float(reader(cache[read] if read else clean_logits[None])[0])
        alphas, rows, layer_ids, heads, deltas = [], [], [], [], []
        at_query: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # kept for joint_effects
        for li, layer in enumerate(resolved):
            pattern = adapter.read(cache, hook_names.pattern(layer), run)[0, :, q, :]  # [h, k]
            v = adapter.read(cache, hook_names.values(layer), run)[0]  # [k, kv or h, d]
            at_query[layer] = (pattern, v)
            group = pattern.shape[0] // v.shape[1]
            alphas.append(pattern.double().cpu())
            h_idx, k_idx = (pattern != 0).nonzero(as_tuple=True)
            delta = pattern[h_idx, k_idx, None] * v[k_idx, h_idx // group]
            base = li * pattern.numel()
            rows.append(base + h_idx * pattern.shape[1] + k_idx)
            layer_ids.append(torch.full_like(h_idx, layer))
            heads.append(h_idx)
            deltas.append(delta)
        alpha = torch.stack(alphas)
        row_of_edge = torch.cat(rows).cpu()
        edits = Edits(torch.arange(len(row_of_edge)), torch.cat(layer_ids).cpu(), torch.cat(heads).cpu(),
                      torch.cat(deltas), len(row_of_edge))
        runner = PrefixRunner(run, tokens) if use == "prefix" else None
        ablated = _ablated(runner, run, tokens, edits, q, reader)
    effect = torch.zeros(alpha.numel(), dtype=torch.float64)
    effect[row_of_edge] = clean - ablated
    return EdgeEffects(effect.view(alpha.shape), alpha, resolved, q, objective, clean, tgt,
                       tokens[0].cpu(), use, dtype,
                       extra={"at_query": at_query, "runner": runner, "reader": reader})


def _read_hook(run: ModelHandle, objective: str) -> str | None:
    """The hook an objective reads instead of the logits: the last hidden state for
    ``"embedding"`` (None: the logits)."""
    return hook_names.resid_post(run.n_layers - 1) if objective == "embedding" else None


def _reader(objective: str, target: Any, logits: torch.Tensor, cache: Any,
            run: ModelHandle) -> tuple[Reader, str | None]:
    """The objective's reader from the clean run (``logits [1, d_vocab]`` at the query;
    ``cache`` holding :func:`_read_hook`) and the hook it reads (None: the logits)."""
    read = _read_hook(run, objective)
    if read is not None:
        return Reader(objective, None, cache[read]), read
    return Reader(objective, target, logits if objective == "kl" else None), None


def _ablated(runner: PrefixRunner | None, run: ModelHandle, tokens: torch.Tensor, edits: Edits,
             query: int, reader: Reader) -> torch.Tensor:
    """``[n_rows]`` the objective of each ablated row, on the prefix path (``runner``) or
    by whole forwards."""
    if runner is not None:
        return runner.run(edits, reader, ROWS["prefix"])
    read = _read_hook(run, reader.objective)
    return full_rows(run, tokens, edits, query, reader, ROWS["full"], read).double().cpu()


@takes_model
def joint_effects(model: ModelLike, fx: EdgeEffects,
                  sets: Sequence[tuple[int, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """``[len(sets)]``: ``objective(clean) - objective(ablated)`` with each set's edges
    removed together, at ``fx``'s input, query and objective (the same model dtype and
    path). A set is ``(layer index into fx.layers, heads [k], keys [k])``."""
    run = handle_in(model, fx.dtype)
    tokens = fx.tokens[None].to(run.device)
    q = fx.query
    rows, layer_ids, heads, deltas = [], [], [], []
    with torch.no_grad(), softmax_in_model_dtype(run):
        at_query, reader, runner = fx.extra.get("at_query"), fx.extra.get("reader"), fx.extra.get("runner")
        if at_query is None or reader is None:  # an EdgeEffects made elsewhere: one clean run
            layers = sorted({fx.layers[li] for li, _, _ in sets})
            names = set(run.info.hooks(layers)) | {_read_hook(run, fx.objective)}
            logits, cache = run.cached_run(tokens, names.__contains__)
            reader, _ = _reader(fx.objective, fx.target, logits[:, q], cache, run)
            at_query = {ly: (adapter.read(cache, hook_names.pattern(ly), run)[0, :, q, :],
                             adapter.read(cache, hook_names.values(ly), run)[0]) for ly in layers}
        if runner is None and fx.path == "prefix":
            runner = PrefixRunner(run, tokens)
        for r, (li, h, k) in enumerate(sets):
            layer = fx.layers[li]
            pattern, v = at_query[layer]
            group = pattern.shape[0] // v.shape[1]
            h, k = h.to(pattern.device), k.to(pattern.device)
            rows.append(torch.full((len(h),), r, dtype=torch.long))
            layer_ids.append(torch.full((len(h),), layer, dtype=torch.long))
            heads.append(h.cpu())
            deltas.append(pattern[h, k, None] * v[k, h // group])
        edits = Edits(torch.cat(rows), torch.cat(layer_ids), torch.cat(heads), torch.cat(deltas), len(sets))
        ablated = _ablated(runner, run, tokens, edits, q, reader)
    return fx.clean - ablated
