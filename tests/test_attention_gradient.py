"""``attention_gradient`` (-a * dL/da, the supervised reference) equals a float64 finite
difference of the loss in the pattern, and does not depend on the batch or its padding."""

import pytest
import torch
from torch.testing import assert_close

from cwlens.engine import hook_names
from cwlens.engine.batching import pad_batch
from cwlens.engine.gradients import attention_gradient, document_loss
from cwlens.engine.handle import wrap
from cwlens.errors import UnsupportedModelError
from cwlens.testing import tiny_model

TEXTS = ["the cat sat on the mat", "paris is the capital of france"]


@pytest.fixture(scope="module", params=["llama", "gemma3"])
def model(request):
    return tiny_model(request.param)


def _loss(model, tokens, layer=None, entry=None, eps=0.0):
    """The loss with ``eps`` added to one entry ``(head, query, key)`` of one layer's pattern."""

    def bump(pattern, hook):
        pattern = pattern.clone()
        pattern[(0, *entry)] += eps
        return pattern

    hooks = [] if layer is None else [(hook_names.pattern(layer), bump)]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        return float(document_loss(model(tokens), tokens))


def test_equals_float64_finite_difference(model):
    model.to(torch.float64)
    try:
        tokens, _ = pad_batch(model, TEXTS[:1])
        scores = attention_gradient(model, tokens)
        pattern = {}
        with torch.no_grad(), model.hooks(fwd_hooks=[
                (hook_names.pattern(ly), lambda p, hook, ly=ly: pattern.__setitem__(ly, p.clone()))
                for ly in range(model.cfg.n_layers)]):
            model(tokens)
        gen = torch.Generator().manual_seed(0)
        n = tokens.shape[1]
        # float64 weights, but Hugging Face's RMSNorm computes in float32, so the loss is
        # float32-precise (~1e-10): central differences at h and 2h with Richardson
        # extrapolation (error O(h^4)) keep the step large
        h = 5e-3
        for _ in range(12):
            layer = int(torch.randint(model.cfg.n_layers, (1,), generator=gen))
            head = int(torch.randint(model.cfg.n_heads, (1,), generator=gen))
            i = int(torch.randint(1, n, (1,), generator=gen))
            j = int(torch.randint(0, i + 1, (1,), generator=gen))
            def central(step, entry=(head, i, j), layer=layer):
                up, down = _loss(model, tokens, layer, entry, step), _loss(model, tokens, layer, entry, -step)
                return (up - down) / (2 * step)

            grad = (4 * central(h) - central(2 * h)) / 3
            expected = -float(pattern[layer][0, head, i, j]) * grad
            assert abs(float(scores[layer][0, head, i, j]) - expected) < 1e-7 + 1e-4 * abs(expected)
        assert all(s.abs().max() > 0 for s in scores.values())
    finally:
        model.to(torch.float32)


def test_batch_and_padding_do_not_change_scores(model):
    tokens, mask = pad_batch(model, TEXTS)
    batched = attention_gradient(model, tokens, mask)
    for row, text in enumerate(TEXTS):
        alone_tokens, _ = pad_batch(model, [text])
        alone = attention_gradient(model, alone_tokens)
        n = alone_tokens.shape[1]
        for ly, s in alone.items():
            real = mask[row].bool()
            assert_close(batched[ly][row][:, real][:, :, real], s[0], rtol=1e-4, atol=1e-6)
            assert n == int(real.sum())
    # pad queries and keys score 0; the parameters' requires_grad is restored
    pad = ~mask.bool()
    assert all((s[:, :, :, :][pad[:, None, :, None].expand_as(s)] == 0).all() for s in batched.values())
    assert all(p.requires_grad for p in model.parameters())


def test_refused_on_encoders():
    with pytest.raises(UnsupportedModelError, match="encoder"):
        attention_gradient(tiny_model("bert"), torch.tensor([[2, 5, 6, 3]]))


def test_peers_run_in_the_faithfulness_harness(model):
    from cwlens.datasets import TextSample
    from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness

    samples = [TextSample(id=f"toy-{k:04d}", text=t, dataset="toy") for k, t in enumerate(TEXTS)]
    alti = "alti"  # on Gemma-3 through its post-attention RMSNorm
    cfg = FaithfulnessConfig(metrics=(alti, "attention_gradient", "attention_gradient_abs",
                                      "contribution"), rates=(0.3,), batch_tokens=64)
    table = run_faithfulness(model, samples, cfg, progress=False).table
    nll = table[table.measure == "nll"]
    assert set(nll.metric) == {"none", alti, "attention_gradient", "attention_gradient_abs",
                               "contribution"}
    got = nll.pivot_table(index=["metric", "mode"], values="value", aggfunc="mean")["value"]
    # the first-order estimate ranks the loss-raising entries first: removing them hurts
    # more than removing the bottom-ranked ones
    assert got[("attention_gradient", "comprehensiveness")] > got[("attention_gradient", "sufficiency")]
    assert got[(alti, "comprehensiveness")] != got[("contribution", "comprehensiveness")]


def _check_margin_item(model, item, n_rows):
    from cwlens.faithfulness import choice
    from cwlens.faithfulness.passes import _batch_objective
    from cwlens.faithfulness.units import choice_units

    unit = choice_units(wrap(model), [item])[0]
    rows = list(range(len(unit.sequences)))
    tokens, mask = pad_batch(model, unit.sequences)
    assert len(rows) == n_rows and bool(mask.all())
    loss = _batch_objective([unit], [0], [rows], [0] * len(rows))
    scores = attention_gradient(model, tokens, mask, loss=loss)
    kwargs = wrap(model).forward_kwargs(mask)
    pattern = {}
    with torch.no_grad(), model.hooks(fwd_hooks=[
            (hook_names.pattern(ly), lambda p, hook, ly=ly: pattern.__setitem__(ly, p.clone()))
            for ly in range(model.cfg.n_layers)]):
        logits = model(tokens, **kwargs)
    # the objective is the margin of the log-likelihoods the accuracy reads
    reqs = choice.encode_items(wrap(model), [item])
    _, which = choice.unique_inputs(reqs)
    lls = [choice.continuation_logprob(logits, w, 0, r) for r, w in zip(reqs, which, strict=True)]
    others = [ll for c, ll in enumerate(lls) if c != item.gold]
    assert abs(float(loss(logits)) + lls[item.gold] - sum(others) / len(others)) < 1e-9

    def margin(layer, row, entry, eps):
        def bump(pattern, hook):
            pattern = pattern.clone()
            pattern[(row, *entry)] += eps
            return pattern

        with torch.no_grad(), model.hooks(fwd_hooks=[(hook_names.pattern(layer), bump)]):
            return float(loss(model(tokens, **kwargs)))

    def central(step, layer, row, entry):
        return (margin(layer, row, entry, step) - margin(layer, row, entry, -step)) / (2 * step)

    h, n = 5e-3, tokens.shape[1]
    for row in rows:
        for layer, head, i in ((0, 0, n - 1), (model.cfg.n_layers - 1, 1, n - 2)):
            entry = (head, i, i // 2)
            grad = (4 * central(h, layer, row, entry) - central(2 * h, layer, row, entry)) / 3
            expected = -float(pattern[layer][(row, *entry)]) * grad
            got = float(scores[layer][(row, *entry)])
            # the margin is a difference of log-likelihoods: float32-precise RMSNorm noise
            assert abs(got - expected) < 1e-6 + 1e-2 * abs(expected), (row, layer, got, expected)
            assert expected != 0 or i != n - 1  # the last position is always read
    own = attention_gradient(model, tokens, mask)  # the rows' own next-token loss differs
    assert not torch.allclose(own[0], scores[0])


def test_multiple_choice_differentiates_the_label_margin(model):
    """On multiple choice the gradient is of the item's label margin, ``-(ll_gold - mean of
    the other choices' ll)`` (the lm-eval log-likelihoods the accuracy reads), not of the
    rows' own next-token loss: float64 finite differences of the margin match, on an item
    whose choices are separate rows (two-token continuations) and on one whose choices
    share a row (one-token continuations read at the same position). Each item is its own
    batch: unpadded (the tiny models' float64 masks turn a left-pad row into NaN)."""
    from cwlens.datasets import ChoiceItem

    items = [ChoiceItem("t-0", ("the cat sat on the",) * 3, (" big mat", " red dog", " old hat"), 2, "t"),
             ChoiceItem("t-1", ("paris is in",) * 2, (" a", " b"), 0, "t")]
    model.to(torch.float64)
    try:
        for item, n_rows in zip(items, (3, 1), strict=True):
            _check_margin_item(model, item, n_rows)
    finally:
        model.to(torch.float32)
