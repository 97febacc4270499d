"""Interventions on encoders (bridge BERT, TransformerLens 4.x): edits of the pattern act.

The bridge wraps Hugging Face's BERT attention and fires ``hook_pattern`` only after the
attention has already used the pattern, so an edit there would be silently dropped;
cwlens routes the pattern through the hook inside the computation instead.
"""

import pytest
import torch
from torch.testing import assert_close

from cwlens.engine import hook_names
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.engine.interventions import run_masked, sinks
from cwlens.testing import tiny_model

TEXTS = ["the cat sat on the mat", "mary gave john a bottle of milk ."]


@pytest.fixture(scope="module")
def bert():
    model = tiny_model("bert")
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        clean = model(tokens, attention_mask=mask)
    return model, tokens, mask, clean


def _shape(model, tokens):
    return (tokens.shape[0], model.cfg.n_heads, tokens.shape[1], tokens.shape[1])


def test_masking_everything_changes_encoder_logits(bert):
    model, tokens, mask, clean = bert
    masks = {ly: torch.ones(_shape(model, tokens), dtype=torch.bool)
             for ly in range(model.cfg.n_layers)}
    out = run_masked(model, tokens, masks, attention_mask=mask)
    assert (out - clean).abs().max() > 1e-3


def test_encoder_masking_one_entry_removes_exactly_its_term(bert):
    """Masking (layer 1, head h, query i, key j) changes what the heads write by a_ij v~_j."""
    model, tokens, mask, clean = bert
    layer, head, i, j = model.cfg.n_layers - 1, 2, 1, 3
    m = torch.zeros(_shape(model, tokens), dtype=torch.bool)
    m[0, head, i, j] = True
    seen = {}

    def keep(name):
        def fn(x, hook):
            seen[name] = x.detach().clone()
        return fn

    names = [hook_names.pattern(layer), hook_names.values(layer), hook_names.o_proj_out(layer)]
    with torch.no_grad():
        model.run_with_hooks(tokens, attention_mask=mask,
                             fwd_hooks=[(n, keep(n)) for n in names])
        a = seen[names[0]][0, head, i, j]
        v = seen[names[1]][0, j, head]
        clean_out = seen[names[2]][0, i]
        from cwlens.engine.interventions import value_masking
        with value_masking(model, {layer: m}):
            model.run_with_hooks(tokens, attention_mask=mask,
                                 fwd_hooks=[(names[2], keep(names[2]))])
    W_O = model.blocks[layer].attn.W_O.detach()[head]  # [d_head, d_model]
    assert_close(clean_out - seen[names[2]][0, i], a * v @ W_O, rtol=1e-4, atol=1e-5)


def test_sink_rate_hook_acts_on_encoder(bert):
    model, tokens, mask, clean = bert
    before = sinks.n_hooks(wrap(model))  # the bridge keeps a few permanent alias hooks on BERT
    with torch.no_grad(), sinks.applied(model, sinks.sink_rate_hooks(model, 0.9)):
        out = model(tokens, attention_mask=mask)
    assert (out - clean).abs().max() > 1e-3
    assert sinks.n_hooks(wrap(model)) == before


def test_seam_leaves_the_clean_encoder_unchanged():
    """Routing the pattern through the hook changes neither logits nor cached patterns."""
    import tempfile

    from transformer_lens.model_bridge import TransformerBridge

    from cwlens.engine.models.loading import load_model
    from cwlens.engine.pattern_seam import ATTN_IMPLEMENTATION
    from cwlens.testing import save_tiny

    path = save_tiny("bert", tempfile.mkdtemp(prefix="cwlens-test-"))
    model = load_model(str(path), device="cpu")
    assert model.original_model.config._attn_implementation == ATTN_IMPLEMENTATION
    plain = TransformerBridge.boot_transformers(str(path), device="cpu")  # HF eager, untouched
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        a, cache_a = model.run_with_cache(tokens, attention_mask=mask)
        b, cache_b = plain.run_with_cache(tokens, attention_mask=mask)
    assert_close(a, b, rtol=0, atol=1e-6)
    name = hook_names.pattern(1)
    assert_close(cache_a[name], cache_b[name], rtol=0, atol=1e-7)


def test_self_check_refuses_a_model_that_drops_pattern_edits():
    """A bridge BERT booted without cwlens' seam, seam disabled: the check raises, no zeros."""
    import tempfile

    from transformer_lens.model_bridge import TransformerBridge

    from cwlens.engine import pattern_seam
    from cwlens.engine.interventions.selfcheck import ensure_edits_act
    from cwlens.errors import InterventionNotAppliedError
    from cwlens.testing import save_tiny

    path = save_tiny("bert", tempfile.mkdtemp(prefix="cwlens-test-"))
    model = TransformerBridge.boot_transformers(str(path), device="cpu")
    real = pattern_seam.enable_pattern_edits
    pattern_seam.enable_pattern_edits = lambda m: False  # as if the seam were unavailable
    try:
        with pytest.raises(InterventionNotAppliedError, match="HookedEncoder"):
            ensure_edits_act(wrap(model), ["pattern"])
    finally:
        pattern_seam.enable_pattern_edits = real
    ensure_edits_act(wrap(model), ["values"])  # hook_v edits do act on the bridge BERT
    ensure_edits_act(wrap(model), ["pattern"])  # and with the seam, pattern edits act too
