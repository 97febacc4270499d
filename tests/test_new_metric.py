"""A new metric is one registry entry (cwlens.core.metrics): registered, the measures, the
stream and the faithfulness harness know it; unregistered, they refuse it again."""

import pandas as pd
import pytest
import torch

import cwlens
from cwlens.core import metrics
from cwlens.errors import UnknownOptionError
from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
from cwlens.testing import tiny_model

# the attention pattern under another name: every number must equal attention's
COPY = metrics.Metric(name="attention_copy", math="a_ij (a copy)",
                      look=metrics.Look("attention (copy)", "copy", "#000000"),
                      compute=lambda g, kind: g.attention().clone())
DOCS = ["The cat sat on the mat and looked at the dog.", "Numbers: one two three four five six."]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def test_a_registered_metric_runs_through_the_harness(model):
    from cwlens.datasets import TextSample

    samples = [TextSample(f"d{i}", t, "toy") for i, t in enumerate(DOCS)]
    with metrics.registered(COPY):
        cfg = FaithfulnessConfig(metrics=("attention", "attention_copy"), rates=(0.3, 1.0))
        table = run_faithfulness(model, samples, cfg, progress=False).table
        tokens = model.to_tokens(DOCS[0])
        _, cache = cwlens.run_with_cache(model, tokens)
        torch.testing.assert_close(cwlens.importance(cache, model, metric="attention_copy"),
                                   cwlens.importance(cache, model, metric="attention"), rtol=0, atol=0)
        _, streamed = cwlens.stream_geometry(
            model, tokens, lambda ly, geo: metrics.from_geometry(geo, "attention_copy"))
        for ly, w in enumerate(streamed):
            torch.testing.assert_close(w, cache[cwlens.engine.hook_names.pattern(ly)], rtol=0, atol=0)
    masked = table[table["mode"] != "clean"]
    key = ["sample_id", "mode", "rate", "measure"]
    copy = masked[masked.metric == "attention_copy"].set_index(key)["value"].sort_index()
    attn = masked[masked.metric == "attention"].set_index(key)["value"].sort_index()
    # samples x modes x rates x (nll, ppl, delta_ppl, tied_share, first_token_share)
    assert len(copy) == len(attn) == 2 * 2 * 2 * 5
    pd.testing.assert_series_equal(copy, attn)  # the same ranking removes the same entries


def test_an_unregistered_metric_is_refused_again():
    with metrics.registered(COPY):
        assert "attention_copy" in metrics.NAMES and "attention_copy" in metrics.GEOMETRY
    assert "attention_copy" not in metrics.NAMES
    with pytest.raises(UnknownOptionError, match="attention_copy"):
        FaithfulnessConfig(metrics=("attention_copy",))
    with pytest.raises(UnknownOptionError, match="registered already"):
        with metrics.registered(metrics.REGISTRY["attention"]):
            pass


def test_the_core_does_not_read_the_registry():
    """``AttentionGeometry.measure`` dispatches to its own methods, not the registry."""
    from cwlens.core.geometry import MEASURES
    from cwlens.testing import random_layer

    assert set(MEASURES) <= set(metrics.GEOMETRY)
    geo = cwlens.AttentionGeometry(*random_layer())
    with metrics.registered(COPY), pytest.raises(UnknownOptionError, match="contribution_abs"):
        geo.measure("attention_copy")
    for name in (m for m in MEASURES if m != "alti"):  # alti needs the residual stream too
        torch.testing.assert_close(geo.measure(name, "intra"), metrics.from_geometry(geo, name, "intra"))
