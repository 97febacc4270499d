"""lm-eval requests as cwlens token requests, grouped into the units the faithfulness sweep
batches (no lm-eval import here).

A request scores a continuation ``y`` after a context ``x``:

    ll(y | x)  = sum_t log P(y[t] | x, y[:t])
    is_greedy  = [argmax_v P(v | x, y[:t]) == y[t] for every t]

Tokens are split as lm-eval's ``TemplateLM._encode_pair`` and cwlens's own
:func:`cwlens.faithfulness.choice.encode_pair` do (one function: the latter): trailing
whitespace of ``x`` moves to ``y``, ``whole = encode(x + y)``, ``ctx = encode(x)``,
``cont = whole[len(ctx):]``, where ``encode`` is the model's own tokenization
(TransformerLens prepends BOS where the model's config says so). An empty context is
the prefix token alone (BOS, or EOS where the tokenizer has no BOS), as lm-eval does.
The model reads ``input = (ctx + cont)[-(max_length + 1):][:-1]`` (left-truncated like
lm-eval's HF model), so the logits at ``start = len(input) - len(cont)`` onwards predict
``cont``.

Requests of one document (same ``(task, doc_id)``) form one unit: its distinct inputs
are the unit's sequences (a BoolQ or MMLU document's choices share one), exactly as
:func:`cwlens.faithfulness.units.choice_units` groups an item's choices, so batches,
padding and masks match a ``run_faithfulness`` run on the same items.
"""

import hashlib
from collections.abc import Sequence
from functools import partial

import torch

from cwlens.engine import lm
from cwlens.engine.batching import token_ids
from cwlens.engine.handle import ModelHandle
from cwlens.errors import CwlensError
from cwlens.faithfulness import choice
from cwlens.faithfulness.units import Unit


def prefix_token_id(handle: ModelHandle) -> int:
    """The token an empty context conditions on: BOS, or EOS without a BOS."""
    tok = handle.tokenizer
    bos = getattr(tok, "bos_token_id", None)
    return int(bos if bos is not None else tok.eos_token_id)


def encode_request(handle: ModelHandle, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """``(context_ids, continuation_ids)`` of one ``(context, continuation)`` request."""
    if context:
        return choice.encode_pair(handle, context, continuation)
    whole = token_ids(handle, continuation).tolist()
    prefix = prefix_token_id(handle)
    if whole and whole[0] == prefix:  # the model prepends BOS: it is the context
        return whole[:1], whole[1:]
    return [prefix], whole


def token_request(
    ctx: Sequence[int], cont: Sequence[int], max_length: int, item: int = 0, index: int = 0
) -> choice.ChoiceRequest:
    """The :class:`~cwlens.faithfulness.choice.ChoiceRequest` that scores ``cont`` after
    ``ctx``, left-truncated to ``max_length`` input tokens."""
    if not cont:
        raise CwlensError("An lm-eval request has an empty continuation: nothing to score.")
    if len(cont) > max_length:
        raise CwlensError(
            f"A continuation of {len(cont)} tokens does not fit the model's context of "
            f"{max_length} tokens; pass a larger max_length in --model_args (up to n_ctx)."
        )
    full = list(ctx) + list(cont)
    inputs = tuple(full[-(max_length + 1):][:-1])
    return choice.ChoiceRequest(item, index, inputs, len(inputs) - len(cont), tuple(cont), 0)


def score_request(logits, row: int, offset: int, request) -> tuple[float, bool]:
    """``(ll, is_greedy)`` from logits ``[batch, pos, vocab]`` of a left-padded batch, or
    its :class:`~cwlens.engine.lm.Unembedded` final residual (the continuation's positions
    unembedded only)."""
    ll = choice.continuation_logprob(logits, row, offset, request)
    n = len(request.continuation_ids)
    pos = offset + request.start + torch.arange(n)
    greedy = lm.logits_at(logits, row, pos).argmax(-1).cpu().tolist() == list(request.continuation_ids)
    return ll, bool(greedy)


def group_units(requests: Sequence[choice.ChoiceRequest], groups: Sequence[object]):
    """``(units, where)``: sweep units (one per distinct group, first-seen order) and, per
    request, ``(unit index, index in unit)``.

    Each unit's ``score`` returns ``{"ll": [...], "greedy": [...]}`` over its requests.
    Its id (which seeds the ``random`` metric) is a digest of its input tokens, so a
    sequence gets the same random mask whatever batch or task it comes in.
    """
    members: dict[object, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    units: list = []
    where: list[tuple[int, int]] = [(0, 0)] * len(requests)
    for u, idx in enumerate(members.values()):
        reqs = [requests[i] for i in idx]
        inputs, which = choice.unique_inputs(reqs)
        for k, i in enumerate(idx):
            where[i] = (u, k)

        def score(logits, rows, offsets, tokens, mask, reqs=reqs, which=which):
            out = [score_request(logits, rows[w], offsets[w], r)
                   for r, w in zip(reqs, which, strict=True)]
            return {"ll": [o[0] for o in out], "greedy": [o[1] for o in out]}

        digest = hashlib.blake2b(repr(inputs).encode(), digest_size=8).hexdigest()
        units.append(Unit(digest, [list(x) for x in inputs], score,
                          positions=partial(choice.read_positions, reqs, which)))
    return units, where
