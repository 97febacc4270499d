"""Value-masking hooks on tiny models: identities, head zeroing, removal after errors."""

import pytest
import torch
from torch.testing import assert_close

from cwlens.engine import hook_names
from cwlens.engine.batching import pad_batch
from cwlens.engine.interventions import hooks_applied, pattern_mask_hook, run_masked, value_masking
from cwlens.errors import ShapeMismatchError
from cwlens.testing import tiny_model

TEXTS = ["the cat sat on the mat", "mary gave john a bottle of milk when they went to the store ."]
ARCHS = ("llama", "gpt2")  # GQA + RoPE, and MHA with biases (all archs: test_architectures)


@pytest.fixture(scope="module", params=ARCHS)
def setup(request):
    model = tiny_model(request.param)
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        clean = model(tokens, attention_mask=mask)
    n_heads = model.cfg.n_heads
    shape = (tokens.shape[0], n_heads, tokens.shape[1], tokens.shape[1])
    return model, tokens, mask, clean, shape


def n_hooks(model) -> int:
    return sum(len(hp.fwd_hooks) for hp in model.hook_dict.values())


def test_empty_mask_leaves_logits_unchanged(setup):
    model, tokens, mask, clean, shape = setup
    masks = {ly: torch.zeros(shape, dtype=torch.bool) for ly in range(model.cfg.n_layers)}
    out = run_masked(model, tokens, masks, attention_mask=mask)
    assert torch.equal(out, clean)
    out = run_masked(model, tokens, masks, renormalize=True, attention_mask=mask)
    assert_close(out, clean, rtol=0, atol=1e-5)
    assert n_hooks(model) == 0


def test_masking_every_key_of_a_head_zeroes_its_output(setup):
    model, tokens, mask, clean, shape = setup
    layer, head = model.cfg.n_layers - 1, 1
    m = torch.zeros(shape, dtype=torch.bool)
    m[:, head] = True
    seen = {}

    def keep_z(z, hook):
        seen["z"] = z.detach().clone()

    with torch.no_grad():
        model.run_with_hooks(tokens, attention_mask=mask,
                             fwd_hooks=[(hook_names.z(layer), keep_z)])
        clean_z = seen["z"]
        with value_masking(model, {layer: m}):
            model.run_with_hooks(tokens, attention_mask=mask,
                                 fwd_hooks=[(hook_names.z(layer), keep_z)])
    z = seen["z"]  # [batch, pos, head, d_head]
    assert torch.equal(z[:, :, head], torch.zeros_like(z[:, :, head]))
    others = [h for h in range(model.cfg.n_heads) if h != head]
    assert_close(z[:, :, others], clean_z[:, :, others])
    assert n_hooks(model) == 0


def test_masking_changes_logits_only_downstream_of_masked_query(setup):
    model, tokens, mask, clean, shape = setup
    m = torch.zeros(shape, dtype=torch.bool)
    q = tokens.shape[1] - 2
    m[:, :, q, :] = True  # every head, one query, layer 0
    out = run_masked(model, tokens, {0: m}, attention_mask=mask)
    real = mask.bool()
    real[:, q:] = False  # causal: earlier real positions are untouched (pad rows are garbage)
    assert_close(out[real], clean[real])
    assert not torch.allclose(out[:, q], clean[:, q])


def test_renormalize_keeps_row_sums():
    pattern = torch.rand(1, 2, 4, 4).tril()
    pattern = pattern / pattern.sum(-1, keepdim=True)
    mask = torch.zeros_like(pattern, dtype=torch.bool)
    mask[..., 0] = True
    out = pattern_mask_hook(mask, renormalize=True)(pattern, hook=None)
    sums = out.sum(-1)
    assert_close(sums[..., 1:], torch.ones_like(sums[..., 1:]))
    assert torch.equal(out[..., 0, :], torch.zeros_like(out[..., 0, :]))  # row fully masked stays 0
    plain = pattern_mask_hook(mask)(pattern, hook=None)
    assert torch.equal(plain[..., 0], torch.zeros_like(plain[..., 0]))
    assert torch.equal(plain[..., 1:], pattern[..., 1:])


def test_hooks_are_removed_after_an_exception(setup):
    model, tokens, mask, _, shape = setup
    wrong = {0: torch.zeros(1, 1, 3, 3, dtype=torch.bool)}  # does not broadcast
    before = n_hooks(model)
    with pytest.raises(ShapeMismatchError, match="mask is"):
        run_masked(model, tokens, wrong, attention_mask=mask)
    assert n_hooks(model) == before
    with pytest.raises(RuntimeError, match="boom"):
        with hooks_applied(model, [(hook_names.pattern(0), lambda p, hook: p)]):
            assert n_hooks(model) == before + 1
            raise RuntimeError("boom")
    assert n_hooks(model) == before


def test_other_hooks_survive(setup):
    model, tokens, mask, _, shape = setup
    name = hook_names.pattern(0)
    model.hook_dict[name].add_hook(lambda p, hook: p)
    try:
        with value_masking(model, {0: torch.zeros(shape, dtype=torch.bool)}):
            assert len(model.hook_dict[name].fwd_hooks) == 2
        assert len(model.hook_dict[name].fwd_hooks) == 1
    finally:
        model.hook_dict[name].remove_hooks("fwd")
