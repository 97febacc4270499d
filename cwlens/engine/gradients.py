"""Attention x gradient: the supervised reference metric of the faithfulness test.

For a language model with next-token loss on the sample's own tokens (``L_b``: the mean
NLL of document ``b``'s targets, :func:`cwlens.core.scoring.token_nll`), the score of
the entry ``(layer, head h, query i, key j)`` is::

    g_ij^h = -a_ij^h * dL_b / da_ij^h

(multiple choice: ``L`` is each item's label margin instead,
:func:`cwlens.faithfulness.choice.margin_loss`, passed as ``loss``), the first-order
estimate of how much ``L_b`` rises when the entry's term ``a_ij v~_j``
is removed (``a_ij -> 0``, the value-masking intervention without renormalisation:
``L(a - a_ij e_ij) ~ L(a) - a_ij dL/da_ij``). ``attention_gradient_abs`` is ``|g|``. It
reads the targets, so it is a *supervised* reference beside the label-free metrics (as
the gradient-based scores of AttnLRP / Grad-SAM are), not an attribution one could
compute without knowing what the model should predict.

How: one forward pass with a zero tensor ``delta`` added to every layer's
``hook_pattern`` (``a + delta``, so the pattern's own graph, and every later layer's
dependence on it, stays intact) and one backward pass for ``dL/d delta = dL/da``. The
model's parameters are frozen for the pass, so no parameter gradient is computed. Cost:
a forward and a backward with the autograd graph of every layer kept (the backward
needs each layer's ``[batch, head, n, n]`` pattern and more): about 3x a forward in
time, and the memory of a training step, ``O(layers * heads * n^2)`` -- unlike the
streamed metrics, it cannot be computed inside the no-grad streaming pass.
"""

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from cwlens.core.numerics import check_finite
from cwlens.core.scoring import token_nll
from cwlens.engine import adapter, hook_names
from cwlens.engine.adapter import Layers
from cwlens.engine.batching import batch_input
from cwlens.engine.entry import ModelLike, takes_model
from cwlens.engine.handle import ModelHandle
from cwlens.engine.interventions.value_masking import hooks_applied
from cwlens.errors import CwlensError


@contextmanager
def _frozen(handle: ModelHandle) -> Iterator[None]:
    """Parameters with ``requires_grad=False`` for the block (restored after)."""
    was = handle.trainable_parameters()
    for p in was:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in was:
            p.requires_grad_(True)


def document_loss(logits: torch.Tensor, tokens: torch.Tensor, attention_mask=None) -> torch.Tensor:
    """``sum_b L_b``, ``L_b`` the mean next-token NLL of document ``b`` (so each document's
    gradient is its own loss's, whatever the batch it is in), from
    :func:`cwlens.core.scoring.token_nll` in float32 (float64 for a float64 model)."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    nll, is_target = token_nll(logits, tokens, attention_mask, dtype)
    return (nll.sum(-1) / is_target.sum(-1).clamp_min(1)).sum()


@takes_model
def attention_gradient(
    model: ModelLike,
    tokens: torch.Tensor | str | list[str],
    attention_mask: torch.Tensor | None = None,
    layers: Layers = None,
    loss: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[int, torch.Tensor]:
    """``{layer: -a * dL/da}``, float32 ``[batch, head_index, query_pos, key_pos]``.

    ``L = sum_b L_b`` (see the module docstring), or ``loss(logits)`` where given (a
    scalar: the faithfulness sweep passes each multiple-choice item's label margin,
    :func:`cwlens.faithfulness.choice.margin_loss`; the ground-truth scores, an output's
    logit, :mod:`cwlens.groundtruth.methods`), which also works on encoders and
    bidirectional models; pad queries and keys get 0. One
    forward and one backward pass with gradients (the only cwlens metric that needs them).

    ``tokens``: ``[batch, pos]`` token ids, a text, or a list of texts; texts of different
    lengths are padded as :func:`cwlens.engine.batching.pad_batch` pads them (left on a
    decoder: row ``b``'s last token is at ``-1``), each row's scores equal its text's alone
    and its pad positions get 0.

    Raises :class:`~cwlens.errors.NonFiniteError` naming the layer (and the heads) where a
    pattern or the scores hold NaN or inf, or where the loss does.
    """
    if loss is None:  # a loss of the caller's own (e.g. an output's logit) suits any model
        adapter.require_next_token_model(
            model.info, "attention_gradient", "Use a decoder (the gradient is of the next-token "
            "loss), or pass loss=... (a scalar function of the logits)."
        )

    resolved, _ = adapter.resolve_layers(model.n_layers, layers)
    # a text or a list of texts is tokenized (different lengths: padded with its own mask,
    # as cwlens.run_with_cache does); tokens and a mask unlike them are refused up front
    given, attention_mask = batch_input(model, tokens, attention_mask, "tokens")
    ids: torch.Tensor = given if isinstance(given, torch.Tensor) else model.to_tokens(given)  # texts
    tokens = ids[None] if ids.ndim == 1 else ids
    deltas: dict[int, torch.Tensor] = {}
    patterns: dict[int, torch.Tensor] = {}

    def tap(layer: int):
        def add_delta(pattern: torch.Tensor, hook) -> torch.Tensor:
            delta = torch.zeros_like(pattern, requires_grad=True)
            deltas[layer], patterns[layer] = delta, pattern.detach()
            return pattern + delta

        add_delta.__name__ = f"cwlens_gradient_delta_{layer}"
        return add_delta

    hooks = [(hook_names.pattern(ly), tap(ly)) for ly in resolved]
    kwargs = model.forward_kwargs(attention_mask)
    with _frozen(model), torch.enable_grad(), hooks_applied(model, hooks):
        logits = model.model(tokens, **kwargs)
        value = (document_loss(logits, tokens.to(logits.device), attention_mask) if loss is None
                 else loss(logits))
        missing = [ly for ly in resolved if ly not in deltas]
        if missing:
            raise CwlensError(f"{hook_names.pattern(missing[0])!r} did not fire: no gradient.")
        for ly in resolved:  # the first broken layer, before the loss that it poisons
            check_finite(patterns[ly], f"the attention pattern ({hook_names.pattern(ly)})", ly, head_dim=1)
            check_finite(model.W_O(ly), "the output projection W_O (a model weight)", ly, head_dim=0)
        check_finite(value.detach(), "the loss whose gradient is taken", None,
                     fix="The attention patterns and W_O are finite, so a later weight (an MLP, "
                     "the unembedding) or an overflow made the logits or the loss NaN or inf: "
                     "check the model's weights with torch.isfinite, or run it in float32.")
        grads = torch.autograd.grad(value, [deltas[ly] for ly in resolved], allow_unused=True)
    out = {}
    for ly, grad in zip(resolved, grads, strict=True):
        if grad is None:
            raise CwlensError(
                f"The loss does not depend on {hook_names.pattern(ly)!r} on this model: the "
                "pattern hook's output is not the one the heads use, so no gradient exists."
            )
        score = -(patterns[ly].float() * grad.float())
        check_finite(score, "the attention x gradient scores", ly, head_dim=1,
                     fix="The pattern and the loss are finite, so dL/da overflowed: run the model "
                     "in float32 (or float64).")
        if attention_mask is not None:
            m = attention_mask.bool().to(score.device)
            score = score * (m[:, None, :, None] & m[:, None, None, :])
        out[ly] = score
    return out
