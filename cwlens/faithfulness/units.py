"""What the sweep scores: one unit per sample (its input sequences and how to score
them), and the fixed plan of batches over the units."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from cwlens.engine import lm
from cwlens.engine.batching import context_cap
from cwlens.engine.handle import ModelHandle
from cwlens.errors import InputTooLongError, InvalidArgumentError
from cwlens.faithfulness import choice


@dataclass
class Unit:
    """One sample: its id, the input sequences it needs, and how to score them."""

    sample_id: str
    sequences: list[list[int]]
    score: Callable  # (output, rows, offsets, tokens, mask) -> {measure: value}; output: lm.LMOutput
    # the score reads the logits of a few positions (the choices' continuations): given
    # ``(rows, offsets)``, the ``(row, position)`` pairs it reads. The passes then skip the
    # unembedding and unembed only those, in one product (lm.Picked), not [batch, pos, d_vocab]
    positions: Callable | None = None
    # the supervised gradient metrics' loss of this unit, ``(logits, rows, offsets) ->``
    # scalar tensor; None: the mean next-token NLL of its sequence (language modelling)
    objective: Callable | None = None


def text_units(handle: ModelHandle, samples, max_tokens, past_context: bool = False,
               prepend_bos: bool = True) -> list[Unit]:
    """One unit per document, cut to ``max_tokens`` and to the model's context (with one
    note when some document is longer; ``past_context``: not cut at the context, rotary
    models only: docs/inputs.md; ``prepend_bos``: :func:`~cwlens.faithfulness.choice.text_ids`)."""
    def score(output, rows, offsets, tokens, mask):
        row = rows[0]
        out = lm.document_scores(lm.rows(output, row, row + 1), tokens[row : row + 1], mask[row : row + 1])
        return {"nll": out[0]["nll"], "ppl": out[0]["ppl"]}

    all_ids = [handle.token_ids(s.text, truncate=False, prepend_bos=prepend_bos).tolist() for s in samples]
    cap = context_cap(handle.info, max_tokens, [len(ids) for ids in all_ids], "documents", past_context)
    for s, ids in zip(samples, all_ids, strict=True):
        if len(ids[:cap] if cap else ids) < 2:
            raise InvalidArgumentError(
                f"{s.id}: {len(ids[:cap] if cap else ids)} token(s) to score"
                + (f" after the cut to {cap} (--max-tokens)" if cap and len(ids) > cap else "")
                + "; the next-token loss needs at least 2 (one to read, one to predict): "
                "raise --max-tokens, or give a longer text")
    return [Unit(s.id, [ids[:cap] if cap else ids], score)
            for s, ids in zip(samples, all_ids, strict=True)]


def choice_units(handle: ModelHandle, items, prepend_bos: bool = True) -> list[Unit]:
    """One unit per multiple-choice item (its choices' distinct inputs; ``prepend_bos``:
    :func:`~cwlens.faithfulness.choice.encode_pair`)."""
    requests = choice.encode_items(handle, items, prepend_bos)
    by_item: dict[int, list] = {}
    for r in requests:
        by_item.setdefault(r.item, []).append(r)
    units = []
    for index, item in enumerate(items):
        reqs = by_item[index]
        inputs, which = choice.unique_inputs(reqs)
        _fits_context(handle, item.id, inputs, item.dataset)

        def score(logits, rows, offsets, tokens, mask, reqs=reqs, which=which, item=item):
            lls = [choice.continuation_logprob(logits, rows[w], offsets[w], r)
                   for r, w in zip(reqs, which, strict=True)]
            return choice.item_scores(lls, [r.continuation_chars for r in reqs], item.gold)

        units.append(Unit(item.id, [list(x) for x in inputs], score,
                          positions=partial(choice.read_positions, reqs, which),
                          objective=partial(_margin, reqs=reqs, which=which, gold=item.gold)))
    return units


def _margin(logits, rows, offsets, reqs, which, gold):
    return choice.margin_loss(logits, reqs, which, rows, offsets, gold)


def _fits_context(handle: ModelHandle, item_id, inputs, dataset: str = "") -> None:
    """A choice prompt cannot be cut without losing its question: refuse one longer than
    the model's context (docs/inputs.md). Few-shot examples are MMLU's only; other
    items are long by their own text."""
    limit = handle.context_length()
    longest = max((len(x) for x in inputs), default=0)
    if limit is not None and longest > limit:
        fix = ("use fewer few-shot examples (--num-fewshot) or a model with a longer context"
               if dataset.startswith("mmlu") else
               f"{dataset or 'its'} items are zero-shot, so only a model with a longer context "
               "takes it")
        raise InputTooLongError(
            f"item {item_id}: a prompt with its answer has {longest} tokens, more than the "
            f"model's context of {limit} (n_ctx); {fix}.")


def plan_batches(units: Sequence[Unit], batch_tokens: int) -> list[list[int]]:
    """Unit indices per batch: sorted by length (stable), at most ``batch_tokens`` padded
    tokens per batch (a longer unit gets a batch of its own)."""
    order = sorted(range(len(units)), key=lambda i: max(map(len, units[i].sequences)))
    batches: list[list[int]] = []
    current: list[int] = []
    n_seq, longest = 0, 0
    for i in order:
        seqs = units[i].sequences
        new_longest = max(longest, *map(len, seqs))
        if current and (n_seq + len(seqs)) * new_longest > batch_tokens:
            batches.append(current)
            current, n_seq, new_longest = [], 0, max(map(len, seqs))
        current.append(i)
        n_seq += len(seqs)
        longest = new_longest
    if current:
        batches.append(current)
    return batches
