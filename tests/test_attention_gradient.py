"""``attention_gradient`` (-a * dL/da, the supervised reference) equals a float64 finite
difference of the loss in the pattern, and does not depend on the batch or its padding."""

import pytest
import torch
from torch.testing import assert_close

from cwlens.engine import hook_names
from cwlens.engine.batching import pad_batch
from cwlens.engine.gradients import attention_gradient, document_loss
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
