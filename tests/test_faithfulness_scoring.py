"""Scoring on tiny models: log-likelihoods and NLLs against hand computation, and the sweep's
own identities (rate 1 comprehensiveness = sufficiency, sharing forward passes is exact)."""

import pytest
import torch
from torch.testing import assert_close

from cwlens.datasets import ChoiceItem, TextSample
from cwlens.engine.batching import pad_batch, pad_rows
from cwlens.engine.handle import wrap
from cwlens.engine.lm import document_scores
from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
from cwlens.faithfulness.choice import (
    continuation_logprob,
    encode_items,
    item_scores,
    unique_inputs,
)
from cwlens.testing import tiny_model

ITEMS = [
    ChoiceItem("t-0", ("the cat sat on the",) * 3, (" mat", " dog ran", " red"), 1, "toy"),
    ChoiceItem("t-1", ("paris is the capital of", "london is the capital of"),
               (" france .", " france ."), 0, "toy"),
    ChoiceItem("t-2", ("one two three",) * 2, (" four", " five"), 0, "toy"),
]
DOCS = [TextSample("d-0", "the cat sat on the mat .", "toy"),
        TextSample("d-1", "mary gave john a bottle of milk when they went to the store .", "toy"),
        TextSample("d-2", "one two", "toy")]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def hand_ll(model, context: str, continuation: str) -> float:
    ctx = model.to_tokens(context)[0].tolist()
    cont = model.tokenizer(continuation, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids)[0].double(), -1)
    return sum(float(logp[len(ctx) - 1 + t, tok]) for t, tok in enumerate(cont))


def test_choice_loglikelihood_matches_hand_computation(model):
    requests = encode_items(wrap(model), ITEMS)
    inputs, which = unique_inputs(requests)
    assert len(inputs) == 2 + 2 + 1  # item 0: " mat"/" red" share an input; item 2 shares one
    tokens, mask = pad_batch(model, [list(x) for x in inputs])
    offsets = mask.int().argmax(-1).tolist()
    with torch.no_grad():
        logits = model(tokens, attention_mask=mask)
    for r, w in zip(requests, which, strict=True):
        got = continuation_logprob(logits, w, offsets[w], r)
        context, continuation = ITEMS[r.item].pairs[r.choice]
        assert got == pytest.approx(hand_ll(model, context, continuation), abs=1e-4)


@pytest.mark.parametrize("side", ["left", "right"])
def test_the_sweep_pads_its_units_as_pad_batch_does(model, side):
    """The sweep pads the token ids it made itself with pad_rows (no checks again): the
    tokens and mask of pad_batch, on the model's pad id, either side."""
    handle = wrap(model)
    rows = [handle.token_ids(d.text).tolist() for d in DOCS]
    tokens, mask = pad_rows(rows, handle.pad_id, side)
    want_tokens, want_mask = pad_batch(model, rows, padding_side=side)
    assert torch.equal(tokens, want_tokens) and torch.equal(mask, want_mask)
    assert mask.sum(1).tolist() == [len(r) for r in rows] and len(set(mask.sum(1).tolist())) > 1
    assert handle.padding_side == "left"


def test_item_scores_sum_and_length_normalised():
    # summed prefers choice 0; per character choice 1 wins
    out = item_scores([-4.0, -6.0], [2, 10], gold=1)
    assert out == {"acc": 0.0, "acc_norm": 1.0, "gold_ll": -6.0}
    assert item_scores([-1.0, -1.0], [3, 3], gold=0)["acc"] == 1.0  # ties: first wins


def test_document_nll_matches_unpadded_runs(model):
    tokens, mask = pad_batch(model, [d.text for d in DOCS])
    with torch.no_grad():
        batch = document_scores(model(tokens, attention_mask=mask), tokens, mask)
    for doc, got in zip(DOCS, batch, strict=True):
        ids = model.to_tokens(doc.text)
        with torch.no_grad():
            logp = torch.log_softmax(model(ids)[0].double(), -1)
        nll = -logp[:-1].gather(-1, ids[0, 1:, None]).squeeze(-1)
        assert got["n_tokens"] == ids.shape[1] - 1
        assert got["nll"] == pytest.approx(float(nll.mean()), abs=1e-4)
        assert got["ppl"] == pytest.approx(float(nll.mean().exp()), rel=1e-4)


def cells(table):
    keep = table[table["mode"] != "clean"]
    return keep.set_index(["metric", "mode", "rate", "sample_id", "measure"])["value"].sort_index()


@pytest.mark.parametrize("data", ["docs", "items"])
def test_rate_one_comprehensiveness_equals_sufficiency(model, data):
    cfg = FaithfulnessConfig(metrics=("attention", "contribution", "random"), rates=(0.5, 1.0),
                             reuse=False, batch_tokens=40)
    samples = DOCS if data == "docs" else ITEMS
    table = run_faithfulness(model, samples, cfg, progress=False).table
    v = cells(table)
    for metric in cfg.metrics:
        comp, suff = v.loc[(metric, "comprehensiveness", 1.0)], v.loc[(metric, "sufficiency", 1.0)]
        assert_close(torch.tensor(comp.values), torch.tensor(suff.values), rtol=0, atol=0)
    # and sharing identical masks (reuse=True) gives the same numbers, with fewer passes
    shared = run_faithfulness(model, samples, FaithfulnessConfig(
        metrics=cfg.metrics, rates=cfg.rates, batch_tokens=40), progress=False)
    assert cells(shared.table).equals(v)


def test_vw_and_vwon_share_masks_at_row_scope(model):
    cfg = FaithfulnessConfig(metrics=("value_weighted", "value_weighted_output_normalized"),
                             rates=(0.3,), modes=("comprehensiveness",))
    result = run_faithfulness(model, DOCS, cfg, progress=False)
    assert result.stats.n_forwards == result.stats.n_batches * 2  # clean + one masked
    head = run_faithfulness(model, DOCS, FaithfulnessConfig(**{**cfg.__dict__, "scope": "layer"}),
                            progress=False)
    assert head.stats.n_forwards == head.stats.n_batches * 3


@pytest.mark.parametrize("scope", ["row", "layer"])
def test_streamed_sweep_equals_ranking_from_a_full_cache(model, scope):
    """The sweep ranks inside the streamed clean pass; the same masks built from a full
    ``run_with_cache`` give bit-identical masked logits, hence the same table."""
    import cwlens
    from cwlens.engine import adapter
    from cwlens.engine.interventions.value_masking import run_masked
    from cwlens.engine.lm import document_scores
    from cwlens.faithfulness.causal_scope import causal_ranking
    from cwlens.faithfulness.ranking import eligible_entries, metric_scores, rank_entries

    cfg = FaithfulnessConfig(metrics=("contribution", "value_weighted_output_normalized"),
                             rates=(0.3,), modes=("comprehensiveness", "sufficiency"),
                             scope=scope, batch_tokens=10_000)
    table = run_faithfulness(model, DOCS, cfg, progress=False).table
    tokens, mask = pad_batch(model, [d.text for d in DOCS])
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
    eligible = eligible_entries(mask)
    for metric in cfg.metrics:
        scored = "value_weighted" if scope == "row" and "output" in metric else metric
        # head/layer scopes are causal in the sweep (cwlens.faithfulness.causal_scope)
        ranks = {ly: causal_ranking(rank_entries(
            metric_scores(adapter.geometry(cache, wrap(model), ly, mask), scored), eligible, scope))
            for ly in range(model.cfg.n_layers)}
        for mode in cfg.modes:
            logits = run_masked(model, tokens, {ly: r.mask(0.3, mode) for ly, r in ranks.items()},
                                attention_mask=mask)
            for row, doc in enumerate(DOCS):
                want = document_scores(logits[row:row + 1], tokens[row:row + 1], mask[row:row + 1])[0]
                got = table[(table.metric == metric) & (table["mode"] == mode)
                            & (table.sample_id == doc.id) & (table.measure == "nll")]["value"]
                assert float(got.iloc[0]) == pytest.approx(want["nll"], rel=1e-6)
