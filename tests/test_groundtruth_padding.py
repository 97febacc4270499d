"""tracr's padding heads (all-zero weights, added so every layer has as many heads) are
in no score: not among the layer level's entries, not among the component level's heads,
not in attention rollout's head mean."""

import torch
from torch.testing import assert_close

from cwlens.core.rollout import rollout
from cwlens.groundtruth import library
from cwlens.groundtruth.evaluate import float64_copy, score_program
from tests._groundtruth_gate import GateProgram


def test_padding_heads_of_the_compiled_models():
    from cwlens.groundtruth.padding import padding_heads

    assert padding_heads(library.load("reverse")).tolist() == [[False], [True], [True], [False]]
    assert padding_heads(library.load("sort")).tolist() == [[True], [False], [False]]
    assert not padding_heads(library.load("first_two_equal")).any()
    assert padding_heads(GateProgram().model).tolist() == [[False, True]]


def test_padding_heads_are_in_no_score():
    """The gate's head 1 has zero weights: the layer level scores head 0's entries only and
    the component level has head 0 alone (a positive), so no AUROC there."""
    gate = GateProgram()
    per = score_program(gate, n_inputs=12, seed=0, n_boot=20).per_input
    inputs = gate.sample_inputs(12, seed=0)
    truths = gate.truth(inputs)
    layer = per[(per["level"] == "layer") & (per["scope"] == "with_fallback")]
    for row in layer.itertuples():
        n = len(inputs[row.input_id])
        assert row.n_entries == (n - 1) * n, row  # head 0's rows q >= 1, every key
    main = per[(per["level"] == "layer") & (per["scope"] == "main")]
    for row in main.itertuples():
        kept = int((~truths[row.input_id].fallback[0, 0, 1:]).sum())
        assert row.n_entries == kept * len(inputs[row.input_id]), row
    component = per[per["level"] == "component"]
    assert (component["n_entries"] == 1).all() and component["auroc"].isna().all()


def test_rollout_leaves_padding_heads_out():
    """reverse: layers 1 and 2 hold only a padding head (their attention writes nothing),
    so rollout over the four layers is rollout over layers 0 and 3."""
    import cwlens
    from cwlens.groundtruth.input_scores import input_scores
    from cwlens.groundtruth.methods import answers_of

    program = library.load("reverse")
    model = float64_copy(program.model)
    tokens = cwlens.groundtruth.encode(model, [["BOS", "a", "c", "b", "d"], ["BOS", "b", "b", "a", "c"]])
    logits, cache = cwlens.circuits.run_with_cache(model, tokens)
    got = input_scores(cwlens.wrap(model), tokens, cache, answers_of(logits))["rollout"]
    patterns = torch.stack([cache[f"blocks.{ly}.attn.hook_pattern"] for ly in (0, 3)])
    assert_close(got, rollout(patterns))


def test_without_padding_averages_the_real_heads():
    from cwlens.groundtruth.padding import without_padding

    patterns = torch.rand(2, 1, 3, 4, 4)
    padding = torch.tensor([[False, True, False], [True, True, True]])
    out = without_padding(patterns, padding)
    assert_close(out[0].mean(-3), patterns[0][:, [0, 2]].mean(-3))
    assert_close(out[1].mean(-3), torch.eye(4).expand(1, 4, 4))
