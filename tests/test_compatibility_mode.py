"""``load_model(..., compatibility_mode=True)`` keeps the value biases in the heads.

TransformerLens 4.3's ``enable_compatibility_mode`` folds b_V into b_O by default
(``fold_value_biases=True``): ``hook_v`` then lacks b_V and every head output lacks
``sum_j a_ij b_V = b_V``, which changes c. cwlens keeps them unfolded, as raw mode and
TransformerLens 3.x (no processing) do. Compatibility mode still centres W_O (the
d_model mean of each row removed), so c equals raw mode's c computed with centred W_O.
"""

import tempfile

import torch
from torch.testing import assert_close

import cwlens
from cwlens.core import AttentionGeometry
from cwlens.engine import hook_names
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.engine.models.loading import load_model
from cwlens.testing import save_tiny

TEXTS = ["the cat sat on the mat", "mary gave john a bottle of milk"]


def _run(model):
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask, closure=True)
    return cache, mask


def test_compatibility_mode_keeps_value_biases_and_c():
    path = str(save_tiny("gpt2", tempfile.mkdtemp(prefix="cwlens-test-")))
    raw = load_model(path, device="cpu")
    compat = load_model(path, device="cpu", compatibility_mode=True)
    cache_r, mask = _run(raw)
    cache_c, _ = _run(compat)
    for ly in range(raw.cfg.n_layers):
        # b_V stays in hook_v (folded, hook_v would differ by b_V: ~0.02 here)
        real = mask.bool()  # pad positions hold garbage in either mode
        assert_close(cache_c[hook_names.values(ly)][real], cache_r[hook_names.values(ly)][real],
                     rtol=1e-4, atol=1e-5)
        W = wrap(raw).W_O(ly)
        centred = W - W.mean(-1, keepdim=True)
        want = AttentionGeometry(cache_r[hook_names.pattern(ly)], cache_r[hook_names.values(ly)],
                                 centred, position_mask=mask.bool()).contribution("inter")
        got = cwlens.contribution_weights(cache_c, compat, layer=ly, attention_mask=mask)
        assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert cwlens.closure(cache_c, compat, attention_mask=mask).worst_relative_error < 1e-5
