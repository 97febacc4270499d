"""Next-token scores on an encoder are refused: masked-LM logits are no next-token model."""

import pytest

from cwlens.datasets import TextSample
from cwlens.engine.handle import wrap
from cwlens.errors import CwlensError, UnsupportedModelError
from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
from cwlens.sinks import sink_norm_intervention
from cwlens.testing import tiny_model


@pytest.fixture(scope="module")
def bert():
    return tiny_model("bert")


def test_adapter_knows_encoders(bert):
    assert wrap(bert).is_encoder
    assert not wrap(tiny_model("gpt2")).is_encoder


def test_faithfulness_refuses_an_encoder(bert):
    samples = [TextSample(id="s0", text="the cat sat on the mat", dataset="fineweb_edu")]
    with pytest.raises(UnsupportedModelError, match="encoder") as err:
        run_faithfulness(bert, samples, FaithfulnessConfig(rates=(0.3,)), progress=False)
    assert isinstance(err.value, CwlensError)


def test_sink_ppl_intervention_refuses_an_encoder(bert):
    import torch

    tokens = torch.tensor([[2, 10, 11, 12, 3]])
    with pytest.raises(UnsupportedModelError, match="no-intervention"):
        sink_norm_intervention(bert, tokens)
