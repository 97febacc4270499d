"""The encoder task: 1 - cos of the mean-pooled sentence embedding under value masking."""

import pytest
import torch

from cwlens.engine import hook_names
from cwlens.engine.batching import pad_batch
from cwlens.errors import UnsupportedModelError
from cwlens.faithfulness.encoder import embedding_damage, mean_pooled, sentences
from cwlens.testing import tiny_model

TEXTS = [("a", "the cat sat on the mat ."), ("b", "paris is the capital of france and a big city .")]


@pytest.fixture(scope="module")
def bert():
    return tiny_model("bert")


def test_damage_is_zero_at_rate_zero_and_total_at_rate_one(bert):
    rows = embedding_damage(bert, TEXTS, ("contribution", "random"), rates=(0.0, 0.5, 1.0))
    by = {(r["sample_id"], r["metric"], r["mode"], r["rate"]): r["damage"] for r in rows}
    assert all(abs(by[(i, m, md, 0.0)]) < 1e-6 for i, _ in TEXTS for m in ("contribution", "random")
               for md in ("comprehensiveness", "sufficiency"))
    # rate 1 removes every entry whatever the ranking: the same damage for both metrics
    for i, _ in TEXTS:
        assert by[(i, "contribution", "comprehensiveness", 1.0)] == pytest.approx(
            by[(i, "random", "sufficiency", 1.0)], abs=1e-6)
        assert by[(i, "contribution", "comprehensiveness", 0.5)] > 1e-4  # the masks act


def test_clean_embedding_is_the_plain_run(bert):
    tokens, mask = pad_batch(bert, [t for _, t in TEXTS])
    kept = {}
    last = hook_names.resid_post(bert.cfg.n_layers - 1)
    with torch.no_grad(), bert.hooks(fwd_hooks=[(last, lambda h, hook: kept.setdefault("h", h))]):
        bert(tokens, attention_mask=mask)
    e = mean_pooled(kept["h"], mask)
    assert e.shape == (2, bert.cfg.d_model) and torch.isfinite(e).all()


def test_refusals_and_sentences(bert):
    with pytest.raises(UnsupportedModelError, match="encoder"):
        embedding_damage(tiny_model("llama"), TEXTS)
    with pytest.raises(UnsupportedModelError, match="next-token"):
        embedding_damage(bert, TEXTS, ("attention_gradient",))
    sents = sentences("fineweb_edu", n=5)
    assert len(sents) == 5 and all(6 <= len(s.split()) <= 40 for _, s in sents)
