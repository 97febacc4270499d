"""Every cwlens surface measures a compiled program like any model (no jax needed): the
streaming engine gives the cached numbers, value masking acts as the truth says it must,
the circuit tools' identities hold, the report runs."""

import pytest
import torch

import cwlens
from cwlens import circuits
from cwlens.engine.interventions.value_masking import run_masked
from cwlens.groundtruth import decode, encode, library
from cwlens.groundtruth.codec import written


@pytest.fixture(scope="module")
def reverse():
    return library.load("reverse")


@pytest.fixture(scope="module")
def prev_token():
    return library.load("prev_token")


def test_stream_equals_the_cached_measures(reverse):
    model = reverse.model
    tokens = encode(model, ["BOS", "a", "b", "c", "d", "a"])
    _, cache = cwlens.run_with_cache(model, tokens)
    for metric in ("attention", "contribution", "value_weighted_output_normalized", "alti"):
        streamed = cwlens.stream(model, tokens, lambda layer, w: w.clone(), metric=metric)
        for layer, got in enumerate(streamed):
            want = cwlens.importance(cache, model, layer, metric=metric)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    out = cwlens.stream_reduce(model, tokens, {"received": cwlens.reducers.ColumnSums("contribution")},
                               query_block=2)
    want = torch.stack([cwlens.contribution_weights(cache, model, ly).sum(2)  # over queries
                        for ly in range(model.cfg.n_layers)])
    torch.testing.assert_close(out["received"].tensor, want, atol=1e-5, rtol=1e-5)


def test_masking_what_moves_silences_the_output_and_the_rest_does_not(prev_token):
    """prev_token's head moves x[i-1] to i (truth.movement): removing those pairs leaves
    every position without a value; removing every other pair changes no output."""
    model = prev_token.model
    tokens_list = ["BOS", "a", "b", "c", "a"]
    (truth,) = prev_token.truth([tokens_list])
    tokens = encode(model, tokens_list)
    moves = truth.movement[0][None]  # [1, head, q, k]
    clean = model(tokens)
    silenced = run_masked(model, tokens, {0: moves})
    assert not written(model, silenced)[0, 1:].any()
    kept = run_masked(model, tokens, {0: ~moves})
    assert decode(model, kept) == decode(model, clean) == ["BOS", "a", "a", "b", "c"]
    torch.testing.assert_close(kept, clean, atol=1e-6, rtol=0)


def test_circuit_tools(reverse):
    model = reverse.model
    tokens = encode(model, ["BOS", "a", "b", "c", "d"])
    logits, cache = circuits.run_with_cache(model, tokens)
    queries = [1, 2, 3, 4]
    answers = logits[:, queries].argmax(-1)
    dla = circuits.direct_logit_attribution(cache, model, logits, queries, answers)
    assert dla.completeness_error < 1e-4  # the terms add up to the logit difference
    flow = circuits.token_flow(cache, model)
    assert bool(torch.isfinite(flow.flows).all())
    scores = circuits.head_scores(cache, model, queries)
    assert set(scores) == {"contribution_share"}
    clean_answers = logits[:, 1:].argmax(-1)

    def metric(lg):
        return lg[:, 1:].gather(-1, clean_answers[..., None])[..., 0].sum(-1)

    corrupted = encode(model, ["BOS", "d", "c", "b", "a"])
    patched = circuits.patch_heads(model, tokens, metric, corrupted=corrupted)
    assert patched.values.shape == (model.cfg.n_layers, model.cfg.n_heads)
    # the copying head (the last layer's) is the one whose patch changes the outputs
    copying = max(reverse.components - {("mlp", ly) for ly in range(model.cfg.n_layers)})
    assert patched.values[copying[1], copying[2]] > 1.0


def test_report_analysis_runs(reverse):
    from cwlens.report.analysis import analyze_text

    result = analyze_text(reverse.model, "BOS a b c d", model_name="reverse", window=None)
    assert result.str_tokens == ["BOS", "a", "b", "c", "d"]
    assert not result.causal
