"""Held-out checks, round 7 (redteam of #39 / #41.1-3): remaining cases of each defect class.

Each test is one finding, xfail(strict=True) until the defect is fixed.
"""

import pytest
import torch

from cwlens.errors import CwlensError, NonFiniteError
from cwlens.testing import tiny_model

SHORT, LONG = "the cat sat", "the dog ran to the big red house and the cat sat on the mat"


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def _nan_in(sub: str):
    model = tiny_model("llama")
    with torch.no_grad():
        [p for n, p in model.named_parameters() if sub in n][0].view(-1)[0] = float("nan")
    return model


# --- #39.1: a list of texts of different lengths -------------------------------------------

def test_token_flow_padded_list_equals_single_run(llama):
    from cwlens import circuits

    _, single = circuits.run_with_cache(llama, llama.to_tokens(LONG))
    _, batch = circuits.run_with_cache(llama, [SHORT, LONG])
    # the long row has no padding: its flows must be the single run's
    torch.testing.assert_close(circuits.token_flow(batch, llama, 1).flows,
                               circuits.token_flow(single, llama, 0).flows, atol=1e-4, rtol=1e-4)


def test_head_scores_never_average_pad_queries(llama):
    from cwlens import circuits

    _, single = circuits.run_with_cache(llama, llama.to_tokens(LONG))
    _, batch = circuits.run_with_cache(llama, [SHORT, LONG])
    want = circuits.head_scores(single, llama, [0])["contribution_share"].values
    try:
        got = circuits.head_scores(batch, llama, [0])["contribution_share"].values
    except CwlensError as err:  # refusing a query that is padding in some row is also right
        assert "pad" in str(err).lower(), err
        return
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# --- #39.2: non-finite values ----------------------------------------------------------------

@pytest.mark.parametrize("weight", ["lm_head", "model.norm"])
def test_sink_norm_intervention_refuses_nan_logits(weight):
    from cwlens import sinks

    model = _nan_in(weight)
    tokens = model.to_tokens("the cat sat on the mat")
    with pytest.raises(NonFiniteError):
        ppl, _ = sinks.sink_norm_intervention(model, tokens)
        summary = sinks.ppl_summary(ppl)
        assert not summary["ppl"].notna().all(), summary  # a NaN must not read as ppl 1.0


# --- #39.4: cwlens-masked --model_args values ------------------------------------------------

@pytest.mark.parametrize("rate", ["5", "nan", "-1"])
def test_lmeval_rate_checked_without_metric(rate):
    from cwlens.errors import UnknownOptionError
    from cwlens.lmeval.settings import masking_config

    with pytest.raises(UnknownOptionError, match="rate"):
        masking_config(rate=rate)


# --- #39.5: listed keys after the query ----------------------------------------------------

def test_token_flow_edges_never_list_future_keys(llama):
    from cwlens import circuits

    text = "the cat sat on the mat and the dog ran"
    _, cache = circuits.run_with_cache(llama, llama.to_tokens(text))
    edges = circuits.token_flow(cache, llama).edges_dataframe(target=3, threshold=0.0)
    assert len(edges) > 0
    assert (edges.from_pos <= edges.to_pos).all(), edges[edges.from_pos > edges.to_pos].head()
    assert (edges.to_pos <= 3).all()


def test_sweep_statistics_padded_list_equals_single_run(llama):
    import cwlens
    from cwlens import sinks

    _, single = cwlens.run_with_cache(llama, SHORT)
    _, batch = cwlens.run_with_cache(llama, [SHORT, LONG])
    want = sinks.sweep_statistics(single, llama)[0]
    got = sinks.sweep_statistics(batch, llama)[0]
    got = got[got["sample"] == 0].reset_index(drop=True)
    cols = ["actual_rate", "n_queries", "s_star_median", "norm_one_over_actual"]
    torch.testing.assert_close(torch.tensor(got[cols].values), torch.tensor(want[cols].values),
                               atol=1e-4, rtol=1e-4)


def test_direct_logit_attribution_padded_list_equals_single_run(llama):
    from cwlens import circuits

    logits_b, batch = circuits.run_with_cache(llama, [SHORT, LONG])
    logits_1, single = circuits.run_with_cache(llama, llama.to_tokens(LONG))
    q = logits_b.shape[1] - 1
    got = circuits.direct_logit_attribution(batch, llama, logits_b, [q], torch.tensor([[5], [5]]),
                                            torch.tensor([[6], [6]])).head_scores().values
    one = circuits.direct_logit_attribution(single, llama, logits_1, [q], torch.tensor([[5]]),
                                            torch.tensor([[6]])).head_scores().values
    short_logits, short = circuits.run_with_cache(llama, llama.to_tokens(SHORT))
    n = short_logits.shape[1] - 1
    two = circuits.direct_logit_attribution(short, llama, short_logits, [n], torch.tensor([[5]]),
                                            torch.tensor([[6]])).head_scores().values
    torch.testing.assert_close(got, (one + two) / 2, atol=1e-4, rtol=1e-4)


def test_attention_gradient_list_of_texts(llama):
    from cwlens.engine.gradients import attention_gradient

    try:
        got = attention_gradient(llama, [SHORT, LONG])
    except CwlensError as err:  # a refusal naming the fix (pad_batch's tokens and mask) is also right
        assert "pad_batch" in str(err) or "token" in str(err), err
        return
    want = attention_gradient(llama, llama.to_tokens(LONG))
    torch.testing.assert_close(got[1][1], want[1][0], atol=1e-5, rtol=1e-4)
