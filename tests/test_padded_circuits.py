"""The circuit tools on a padded list of texts (#39.1, held-out round 7's class): every
function that reads a cache of cwlens.circuits.run_with_cache([texts]) reads each row at
its real tokens (the single run's numbers) or refuses a position that is padding."""

import pytest
import torch

from cwlens import circuits
from cwlens.errors import InvalidArgumentError
from cwlens.testing import tiny_model

SHORT, LONG = "the cat sat", "the dog ran to the big red house and the cat sat on the mat"


@pytest.fixture(scope="module", params=["llama", "gpt2", "qwen3", "mistral"])
def model(request):
    return tiny_model(request.param)


def test_token_flow_padded_row_equals_its_single_run(model):
    _, batch = circuits.run_with_cache(model, [LONG, SHORT])
    _, single = circuits.run_with_cache(model, model.to_tokens(SHORT))
    got = circuits.token_flow(batch, model, 1, str_tokens=model.to_str_tokens(model.to_tokens([LONG, SHORT])[1]))
    want = circuits.token_flow(single, model, 0)
    assert got.flows.shape == want.flows.shape  # the pad positions are left out
    torch.testing.assert_close(got.flows, want.flows, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.node_importance(-1), want.node_importance(-1), atol=1e-4, rtol=1e-4)
    assert len(got.str_tokens) == want.flows.shape[-1]
    # every listed edge exists: from a key at or before its query, into a node at or before the target
    edges = got.edges_dataframe(target=2, threshold=0.0)
    assert len(edges) > 0 and (edges.from_pos <= edges.to_pos).all() and (edges.to_pos <= 2).all()


def test_head_scores_last_token_equals_single_runs(model):
    _, batch = circuits.run_with_cache(model, [SHORT, LONG])
    want = sum(circuits.head_scores(circuits.run_with_cache(model, model.to_tokens(t))[1], model,
                                    [-1])["contribution_share"].values for t in (SHORT, LONG)) / 2
    got = circuits.head_scores(batch, model, [-1])["contribution_share"].values
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_pad_positions_are_refused(model):
    logits, batch = circuits.run_with_cache(model, [SHORT, LONG])
    with pytest.raises(InvalidArgumentError, match="padding in row 0"):
        circuits.head_scores(batch, model, [0])
    with pytest.raises(InvalidArgumentError, match="key position 0 of row 0 is padding"):
        circuits.head_scores(batch, model, [-1], keys=torch.tensor([[0], [0]]))
    with pytest.raises(InvalidArgumentError, match="padding in row 0"):
        circuits.direct_logit_attribution(batch, model, logits, [1], torch.tensor([[5], [5]]))


def test_direct_logit_attribution_padded_batch_is_complete(model):
    logits, batch = circuits.run_with_cache(model, [SHORT, LONG])
    dla = circuits.direct_logit_attribution(batch, model, logits, [-1], torch.tensor([[5], [7]]))
    assert dla.completeness_error < 1e-4


def test_attention_gradient_padded_row_equals_its_text_alone():
    from cwlens.engine.gradients import attention_gradient

    model = tiny_model("llama")
    got = attention_gradient(model, [LONG, SHORT])
    want = attention_gradient(model, SHORT)
    n = want[0].shape[-1]
    for layer in got:
        torch.testing.assert_close(got[layer][1, :, -n:, -n:], want[layer][0], atol=1e-5, rtol=1e-4)
        assert not bool(got[layer][1, :, :-n].any()) and not bool(got[layer][1, :, :, :-n].any())



def test_patch_heads_refuses_texts_naming_the_fix():
    model = tiny_model("llama")
    with pytest.raises(InvalidArgumentError, match="clean must be a \\[batch, pos\\] tensor"):
        circuits.patch_heads(model, [SHORT, LONG], lambda logits: logits[:, -1, 0], mode="mean")
    tokens = model.to_tokens(SHORT)
    with pytest.raises(InvalidArgumentError, match="corrupted must be"):
        circuits.patch_heads(model, tokens, lambda logits: logits[:, -1, 0], corrupted=[SHORT])
