"""Integration tier: every method scored against a hand-compiled program whose truth is
known entry by entry (tests/_groundtruth_gate.py), the model-side methods against cwlens's
own functions and plain autograd, and the summary against the bootstrap it cites."""

import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch.testing import assert_close

from cwlens.core.bootstrap import holm, paired_bootstrap, studentized
from cwlens.engine.handle import wrap
from cwlens.groundtruth import methods, report, scoring
from cwlens.groundtruth.codec import encode
from cwlens.groundtruth.evaluate import all_scores, corrupt, float64_copy, score_program
from tests._groundtruth_gate import GateProgram, gate_truth


@pytest.fixture(scope="module")
def gate():
    return GateProgram()


@pytest.fixture(scope="module")
def scored(gate):
    return score_program(gate, n_inputs=30, seed=0, n_boot=200)


def _cell(summary, method, scope="main"):
    row = summary[(summary["method"] == method) & (summary["scope"] == scope)]
    assert len(row) == 1, (method, scope)
    return row.iloc[0]


def test_every_method_is_scored_once(scored):
    main = scored.summary[scored.summary["scope"] == "main"]
    assert list(main["method"]) == [m.name for m in methods.METHODS]
    assert scored.output_mismatches == 0  # the network computes the program exactly
    fallback = scored.summary[scored.summary["scope"] == "with_fallback"]
    assert list(fallback["method"]) == [m.name for m in methods.of_level("layer")]


def test_movement_and_the_value_less_bos(scored):
    """Rows that moved something: every layer method finds the moved entry. Fall-back rows
    (attention ~1 on a BOS whose value is zero) are negatives that attention ranks as high
    as the truth, and the value-aware measures rank at zero."""
    s = scored.summary
    for m in methods.of_level("layer"):
        assert _cell(s, m.name)["auroc"] == pytest.approx(1.0, abs=1e-12), m.name
    attention = _cell(s, "attention", "with_fallback")
    assert attention["auroc"] < 0.99
    for name in ("value_weighted", "contribution", "contribution_intra", "alti"):
        cell = _cell(s, name, "with_fallback")
        assert cell["auroc"] == pytest.approx(1.0, abs=1e-12), name
        assert cell["resolved"] and cell["delta"] > 0  # Holm-resolved above attention


def test_components(gate):
    """Head 0 is the program's only head; head 1 is empty (uniform attention, no output).
    Scored with head 1 (``heads`` of score_input: every head), where head 0 falls back on
    every query (tokens[1] == "b") attention off BOS ranks the empty head first, and every
    value-aware score ties the heads at 0. (evaluate leaves the empty head out:
    tests/test_groundtruth_padding.py.)"""
    model = float64_copy(gate.model)
    inputs = gate.sample_inputs(30, seed=0)
    labels = torch.tensor([[True, False]])
    for row, truth in zip(inputs, gate.truth(inputs), strict=True):
        tokens = encode(model, row)
        scores, _ = all_scores(model, tokens, encode(model, corrupt([row], gate.vocab, 1)))
        one = {"component": {m: v[0] for m, v in scores["component"].items()}}
        got = {r["method"]: r["auroc"] for r in scoring.score_input(truth, one, labels, False)}
        if row[1] == "a":
            assert got["contribution_share"] == 1.0 and got["activation_patching"] == 1.0
        else:
            assert got["attention_off_bos"] == 0.0 and got["contribution_share"] == 0.5


def test_layer_scores_are_the_measures(gate):
    """The layer scores are cwlens's own measures of the same run, rows of a zero output set
    to 0 for the output-normalised ones."""
    import cwlens

    model = float64_copy(gate.model)
    tokens = encode(model, [["BOS", "a", "b", "a"], ["BOS", "b", "b", "a"]])
    bad = encode(model, corrupt([["BOS", "a", "b", "a"], ["BOS", "b", "b", "a"]], gate.vocab, 1))
    scores, _ = all_scores(model, tokens, bad)
    _, cache = cwlens.run_with_cache(model, tokens)
    assert_close(scores["layer"]["attention"][:, 0], cache["blocks.0.attn.hook_pattern"].double())
    c = cwlens.contribution_weights(cache, model, layer=0, kind="intra").double()
    moved = torch.tensor([[1, 3], [1, 3]])  # odd queries of input 0 moved; input 1 none
    got = scores["layer"]["contribution_intra"][:, 0, 0]
    assert_close(got[0, 1], c[0, 0, 1])
    assert_close(got[0, 3], c[0, 0, 3])
    assert got[1].abs().max() == 0 and got[0, 2].abs().max() == 0  # fall-back rows
    assert moved.shape == (2, 2)
    gradient = cwlens.engine.gradients.attention_gradient(
        model, tokens, loss=methods.output_loss(methods.answers_of(model(tokens))))
    assert_close(scores["layer"]["attention_gradient"][:, 0], gradient[0].double())


def test_patching_equals_patch_heads(gate):
    """The batched per-input patching equals cwlens.circuits.patch_heads run on each input."""
    from cwlens.circuits import patch_heads
    from cwlens.groundtruth.layer_scores import patching_effects

    model = float64_copy(gate.model)
    inputs = [["BOS", "a", "b", "a"], ["BOS", "a", "a", "b"]]
    tokens = encode(model, inputs)
    bad = encode(model, corrupt(inputs, gate.vocab, 3))
    answers = methods.answers_of(model(tokens))
    got = patching_effects(wrap(model), tokens, bad, answers)
    for b in range(2):
        clean = methods.outputs(model(tokens[b:b + 1]), answers[b:b + 1]).double()

        def metric(logits, b=b, clean=clean):
            y = methods.outputs(logits, answers[b:b + 1].expand(logits.shape[0], -1)).double()
            return -(y - clean).abs()[:, 1:].mean(-1)

        want = patch_heads(model, tokens[b:b + 1], metric, corrupted=bad[b:b + 1]).values
        assert_close(got[b], want)
    assert got[:, 0, 0].min() > 0.4 and got[:, 0, 1].abs().max() == 0


def test_captum_scores_equal_autograd(gate):
    """Saliency and input x gradient are the plain gradient of y_q w.r.t. the layer-0
    residual; integrated gradients match a 400-step midpoint Riemann sum."""
    from cwlens.groundtruth.input_scores import captum_scores

    model = float64_copy(gate.model)
    tokens = encode(model, [["BOS", "a", "b", "a"]])
    answers = methods.answers_of(model(tokens))
    got = captum_scores(wrap(model), tokens, answers)
    name = "blocks.0.hook_resid_pre"
    _, cache = model.run_with_cache(tokens, names_filter=[name])
    x = cache[name].detach()

    def y_of(embedded, q):
        with model.hooks(fwd_hooks=[(name, lambda r, hook: embedded)]):
            return methods.outputs(model(tokens.expand(embedded.shape[0], -1)), answers.expand(
                embedded.shape[0], -1))[:, q]

    for q in (1, 2, 3):
        xg = x.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(y_of(xg, q).sum(), xg)
        assert_close(got["saliency"][0, q], grad.abs().sum(-1)[0])
        assert_close(got["input_x_gradient"][0, q], (x * grad).sum(-1).abs()[0])
        steps = 400
        alphas = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps
        path = (alphas[:, None, None] * x[0]).requires_grad_(True)
        (g,) = torch.autograd.grad(y_of(path, q).sum(), path)
        ig = (x[0] * g.mean(0)).sum(-1).abs()
        assert_close(got["integrated_gradients"][0, q], ig, atol=2e-3, rtol=2e-2)


def test_score_input_entries():
    """Which entries each level scores: no BOS row, no fall-back row (main), no BOS column
    at the input level, only visible keys in a causal model."""
    truth = gate_truth(["BOS", "a", "b", "a"])
    keep = scoring.layer_entries(truth, causal=False)
    assert not keep[..., 0, :].any()  # BOS row
    assert keep[0, 0, 1].all() and not keep[0, 0, 2].any()  # row 2 fell back
    assert keep[0, 1, 1:].all()  # head 1 never falls back
    assert scoring.layer_entries(truth, causal=False, with_fallback=True)[0, 0, 2].all()
    inp = scoring.input_entries(4, causal=True)
    assert not inp[:, 0].any() and not inp[0].any() and not inp[1, 2:].any() and inp[3, 1:].all()


def test_score_input_leaves_undefined_entries_out_for_every_method():
    truth = gate_truth(["BOS", "a", "b"])
    good = truth.movement.double()
    broken = good.clone()
    broken[0, 1, 1, 2] = math.nan
    rows = scoring.score_input(truth, {"layer": {"attention": good, "contribution": broken}},
                               torch.tensor([[True, False]]), causal=False)
    main = {r["method"]: r for r in rows if r["scope"] == "main"}
    assert main["attention"]["n_entries"] == main["contribution"]["n_entries"]
    assert main["attention"]["n_undefined"] == 1
    assert main["contribution"]["auroc"] == 1.0


def test_summary_is_the_bootstrap_it_cites():
    """Means, intervals and the Holm-resolved differences are cwlens.core.bootstrap's, on
    the inputs where every method of the level has an AUROC."""
    rng = np.random.default_rng(0)
    rows = []
    values = {"attention": rng.uniform(0.5, 0.7, 12), "contribution": rng.uniform(0.7, 0.9, 12),
              "alti": rng.uniform(0.5, 0.7, 12)}
    values["alti"][3] = np.nan  # input 3 has no AUROC: left out for every method
    for m, v in values.items():
        for i, a in enumerate(v):
            rows.append(dict(program="p", input_id=i, length=3, method=m, level="layer",
                             scope="main", auroc=a, precision_at_truth=a / 2, n_positive=1,
                             n_entries=4, n_undefined=0))
    summary = scoring.summarize(pd.DataFrame(rows), n_boot=300)
    keep = np.arange(12) != 3
    contribution = summary[summary["method"] == "contribution"].iloc[0]
    mean, lo, hi, _ = studentized(values["contribution"][keep], 300)
    assert contribution["n"] == 11
    assert contribution["auroc"] == pytest.approx(mean)
    assert contribution["auroc_low"] == pytest.approx(lo)
    assert contribution["auroc_high"] == pytest.approx(min(hi, 1.0))
    tests = {m: paired_bootstrap(values["attention"][keep], values[m][keep], 300)
             for m in ("contribution", "alti")}
    resolved = holm(tests)
    for m in ("contribution", "alti"):
        row = summary[summary["method"] == m].iloc[0]
        assert row["delta"] == pytest.approx(tests[m].mean)
        assert bool(row["resolved"]) == (resolved[m].sign != 0)
    assert bool(contribution["resolved"]) and not bool(summary.iloc[2]["resolved"])


def test_json_shape(scored):
    doc = report.program_json(scored)
    assert set(doc) == {"program", "n_inputs", "output_mismatches", "n_inputs_scored",
                        "silent_row_threshold", "methods"}
    assert doc["program"] == "gate" and doc["n_inputs"] == 30
    assert doc["n_inputs_scored"]["component"] == 0  # head 1 (padding) is in no score
    assert set(doc["methods"]) == {m.name for m in methods.METHODS}
    for name, entry in doc["methods"].items():
        assert set(entry) >= {"level", "auroc", "ci", "precision_at_truth", "n_inputs_scored"}
        assert entry["level"] == methods.BY_NAME[name].level
        if entry["level"] == "component":
            assert entry["auroc"] is None
            continue
        assert len(entry["ci"]) == 2 and entry["ci"][0] <= entry["auroc"] <= entry["ci"][1]
    assert isinstance(report.json_document([scored, scored]), list)


def test_markdown_cites_every_cell(scored):
    text = report.markdown(scored.summary, 30, 0, "cwlens groundtruth --inputs 30")
    assert "`cwlens groundtruth --inputs 30`" in text
    att = _cell(scored.summary, "attention", "with_fallback")
    assert f"{att['auroc']:.2f} [{att['auroc_low']:.2f}, {att['auroc_high']:.2f}]" in text
    assert "| contribution (inter) |" in text and "▲" in text


def test_batched_flows_equal_token_flow(gate):
    """The input level's token flows, all sequences at once, are token_flow's of each."""
    import cwlens
    from cwlens.groundtruth.input_scores import FLOW_RULES, final_flows

    model = float64_copy(gate.model)
    tokens = encode(model, [["BOS", "a", "b", "a"], ["BOS", "b", "a", "a"]])
    _, cache = cwlens.circuits.run_with_cache(model, tokens)
    got = final_flows(cache, wrap(model))
    for rule in FLOW_RULES:
        for b in range(2):
            want = cwlens.circuits.token_flow(cache, model, batch=b, rule=rule).flows[-1]
            assert_close(got[f"flow_{rule}"][b], want)


def test_constant_scores_get_the_no_spread_convention():
    """30 copies of 2/3 (AUROCs are ratios of counts): the interval is [2/3, 2/3] and a
    constant difference is resolved, as cwlens.core.bootstrap treats a sample without
    spread, not NaN from rounding noise over rounding noise."""
    rows = []
    for i in range(30):
        for m, a in (("attention", 1 / 3), ("contribution", 2 / 3 + (i % 2) * 1e-16),
                     ("alti", 1 / 3)):
            rows.append(dict(program="p", input_id=i, length=3, method=m, level="layer",
                             scope="main", auroc=a, precision_at_truth=a, n_positive=1,
                             n_entries=3, n_undefined=0))
    summary = scoring.summarize(pd.DataFrame(rows), n_boot=200).set_index("method")
    assert summary.loc["contribution", "auroc_low"] == summary.loc["contribution", "auroc_high"]
    assert summary.loc["contribution", "auroc_low"] == pytest.approx(2 / 3)
    assert summary.loc["contribution", "resolved"] and summary.loc["contribution", "delta_low"] > 0.33
    assert not summary.loc["alti", "resolved"]  # identical to attention: no test


def test_the_softmax_leak_ranks_nothing():
    """Attention of 1.000000 on a moved key and 0.999999 on a fall-back BOS (successor's
    numbers) are a tie: float64 resolves them, the ranking must not."""
    truth = gate_truth(["BOS", "a", "b"])  # row 1 moved key 1; row 2 fell back
    att = torch.zeros(1, 2, 3, 3, dtype=torch.float64)
    att[0, 0, 1, 1] = 1.0 - 1e-7
    att[0, 0, 2, 0] = 1.0 - 1e-6  # the BOS of the fall-back row, by a hair below
    rows = scoring.score_input(truth, {"layer": {"attention": att}}, torch.tensor([[True, False]]),
                               causal=False)
    with_fallback = next(r for r in rows if r["scope"] == "with_fallback")
    assert with_fallback["auroc"] < 1.0  # the tie counts one half
    got = scoring.resolution(torch.tensor([[1.0, 1.0 - 1e-6, 0.5, 0.5 + 1e-3]], dtype=torch.float64))
    assert torch.equal(got, torch.tensor([[1e4, 1e4, 5e3, 5010.0]], dtype=torch.float64))
    # an input whose every row fell back has no entry in the main scope: no AUROC, no error
    truth = gate_truth(["BOS", "b", "a"])
    everything_fell_back = type(truth)(truth.tokens, truth.dependence, truth.movement,
                                       torch.ones_like(truth.fallback), truth.output)
    rows = scoring.score_input(everything_fell_back, {"layer": {"attention": att}},
                               torch.tensor([[True, False]]), causal=False)
    main = next(r for r in rows if r["scope"] == "main")
    assert main["n_entries"] == 0 and math.isnan(main["auroc"])


def test_the_silent_row_threshold_is_the_one_used_and_written(gate):
    """--silent-row-threshold 0 scores without the rule (only ||o|| = 0 rows are silent);
    the JSON says which threshold its scores used."""
    from cwlens.circuits.compare import circuit_cache
    from cwlens.groundtruth.layer_scores import layer_scores

    model = float64_copy(gate.model)
    tokens = encode(model, [["BOS", "b", "a", "b"]])  # every row of head 0 falls back
    logits, cache = circuit_cache(model, tokens)
    answers = methods.answers_of(logits)
    masked = layer_scores(wrap(model), tokens, cache, answers)["contribution"][0, 0, 0, 1:]
    unmasked = layer_scores(wrap(model), tokens, cache, answers, 0.0)["contribution"][0, 0, 0, 1:]
    assert (masked == 0).all() and (unmasked.sum(-1) - 1).abs().max() < 1e-6  # the leak, shared out
    scores = score_program(gate, n_inputs=6, seed=0, n_boot=20, zero_output=0.0)
    assert report.program_json(scores)["silent_row_threshold"] == 0.0
