"""The encoder faithfulness task: damage to the sentence embedding under value masking.

An encoder is used through its sentence embedding ``e = mean_{i real} h_i`` (mean
pooling of the last hidden state over the real tokens, as sentence-transformers does for
all-MiniLM-L6-v2). Next-token loss means nothing for it (its logits are masked-LM or,
for a ``BertModel``, absent), so the damage of a mask is::

    damage = 1 - cos(e_masked, e_clean)          (0: unchanged, 2: opposite)

Rankings and masks are those of the decoder task (:mod:`~cwlens.faithfulness.ranking`)
with ``causal_only=False`` (every real key of a row is eligible: attention is
bidirectional) and the first token ([CLS]) eligible. One streamed clean pass per batch
gives every metric's ranking layer by layer; then one masked pass per (metric, mode,
rate). The label-free geometry metrics and ``random`` are supported; the gradient metrics
are next-token references and are refused on encoders.

Texts: the shipped documents split into sentences (:func:`sentences`).
"""

import re

import torch

from cwlens.core import metrics
from cwlens.core._types import Kind, Scope
from cwlens.core.bitmask import PackedMask
from cwlens.datasets import load_dataset
from cwlens.engine import adapter, hook_names
from cwlens.engine.batching import pad_batch
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.interventions.value_masking import hooks_applied, masking_hooks
from cwlens.engine.streaming import stream_geometry
from cwlens.errors import UnsupportedModelError
from cwlens.faithfulness.ranking import (
    MODES,
    eligible_entries,
    first_token,
    mask_counts,
    mask_shares,
    metric_scores,
    random_scores,
    rank_entries,
    tiebreak_scores,
)


def sentences(dataset: str = "fineweb_edu", n: int = 64, min_words: int = 6,
              max_words: int = 40) -> list[tuple[str, str]]:
    """``[(id, sentence)]``: the first ``n`` sentences of ``min_words``..``max_words``
    words from a shipped dataset's documents (split after ``.``, ``!``, ``?``)."""
    out = []
    for doc in load_dataset(dataset):
        text = getattr(doc, "text", "")  # a text dataset's documents
        for k, sent in enumerate(re.split(r"(?<=[.!?])\s+", text.replace("\n", " "))):
            if min_words <= len(sent.split()) <= max_words:
                out.append((f"{doc.id}/{k}", sent.strip()))
                if len(out) == n:
                    return out
    return out


def mean_pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[batch, d_model]``: the mean of ``hidden`` over the real positions."""
    m = mask.to(hidden.dtype)[..., None]
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1)


BATCH_SIZE = 16  # sentences per forward pass


@takes_model
def embedding_damage(model: ModelLike, texts, metric_names=("attention", "contribution", "random"),
                     rates=(0.1, 0.3), scope: Scope = "row", kind: Kind = "inter",
                     seed: int = 0, mask_first_token: bool = True) -> list[dict]:
    """Rows ``{sample_id, metric, mode, rate, damage, tied_share, first_token_share}``
    (``damage = 1 - cos``) for ``texts`` (``[(id, text)]``) on an encoder ``model``, in
    both modes (:data:`~cwlens.core.metrics.MODES`), :data:`BATCH_SIZE` sentences per pass.

    Ties are broken by the seeded random order of the decoder task; ``tied_share`` and
    ``first_token_share`` are the removed entries chosen by it and those on [CLS]
    (:func:`~cwlens.faithfulness.ranking.mask_counts`). ``mask_first_token=False``: [CLS]
    is never masked (the view of ferret, which drops the special tokens)."""
    modes = MODES
    if not model.is_encoder:
        raise adapter.UnsupportedModelError(
            "The sentence-embedding task is for encoders; decoders use run_faithfulness.")
    for name in metric_names:
        if metrics.get(name).source == "gradient":
            raise UnsupportedModelError(
                f"{name} is the gradient of a next-token loss: not defined on an encoder.")
    last = hook_names.resid_post(model.n_layers - 1)
    rows = []
    for start in range(0, len(texts), BATCH_SIZE):
        chunk = texts[start : start + BATCH_SIZE]
        ids = [i for i, _ in chunk]
        tokens, mask = pad_batch(model, [t for _, t in chunk])
        kept: dict[str, torch.Tensor] = {}

        def keep(hidden, hook, kept=kept):
            kept["h"] = hidden.detach()

        counts: dict = {}

        def layer_masks(layer, geo, mask=mask, ids=ids, counts=counts):
            elig = eligible_entries(mask, causal_only=False, mask_first_token=mask_first_token)
            ties = tiebreak_scores(geo.pattern.shape, mask, ids, seed, layer)
            first = first_token(mask)
            out = {}
            for name in metric_names:
                scores = (random_scores(geo.pattern.shape, mask, ids, seed, layer) if name == "random"
                          else metric_scores(geo, name, kind))
                ranking = rank_entries(scores, elig, scope, ties)
                for mode in modes:
                    for rate in rates:
                        removed = ranking.mask(rate, mode)
                        out[(name, mode, rate)] = PackedMask.pack(removed)
                        c = mask_counts(scores, elig, removed, scope, first).cpu()
                        counts[(name, mode, rate)] = counts.get((name, mode, rate), 0) + c
            return out

        with hooks_applied(model, [(last, keep)]):  # (a read: no edit to check)
            _, per_layer = stream_geometry(model, tokens, layer_masks, attention_mask=mask)
        clean = mean_pooled(kept["h"], mask)
        for key in per_layer[0]:
            masks = {ly: per_layer[ly][key] for ly in range(model.n_layers)}
            with torch.no_grad(), hooks_applied(model, masking_hooks(masks) + [(last, keep)]):
                model(tokens, **model.forward_kwargs(mask))
            cos = torch.nn.functional.cosine_similarity(mean_pooled(kept["h"], mask), clean, dim=-1)
            name, mode, rate = key
            rows += [{"sample_id": i, "metric": name, "mode": mode, "rate": rate,
                      "damage": float(1 - c), **mask_shares(n)}
                     for i, c, n in zip(ids, cos.tolist(), counts[key], strict=True)]
    return rows
