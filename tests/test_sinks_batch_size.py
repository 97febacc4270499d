"""The sink-norm intervention's numbers do not depend on the batch size: each text's random
control position is drawn from (seed, its id) and its low-norm heads are those below its
own quantile, so a text's rows are the same alone as in a padded batch of three."""

import pandas as pd
import pytest
import torch

from cwlens.core.sinks import first_real_index, random_non_sink_index
from cwlens.datasets import TextSample
from cwlens.sinks import run as sink_run
from cwlens.sinks.norm_intervention import sample_uniform
from cwlens.testing import tiny_model

TEXTS = ["the cat sat on the mat and then it slept in the sun", "a b c d e f g h",
         "one two three four five six seven eight nine ten eleven twelve thirteen"]


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _tables(model, batch_size, seed=0):
    samples = [TextSample(f"t{i}", t, "toy") for i, t in enumerate(TEXTS)]
    return sink_run.analyse(model, samples, max_tokens=32, batch_size=batch_size, seed=seed,
                            scales=(0.0, 0.5), progress=False)


def _sorted(frame, keys):
    return frame.sort_values(keys).reset_index(drop=True)


def test_intervention_rows_equal_for_batches_of_one_and_of_three(model):
    one, three = _tables(model, 1), _tables(model, 3)
    keys = ["sample", "target", "scale"]
    a, b = _sorted(one["ppl"], keys), _sorted(three["ppl"], keys)
    pd.testing.assert_frame_equal(a, b, rtol=1e-4, atol=1e-4)
    keys = ["target", "scale", "layer"]
    a, b = _sorted(one["norm"], keys), _sorted(three["norm"], keys)
    n_cols = [c for c in a.columns if c.startswith("n_")]
    pd.testing.assert_frame_equal(a[n_cols], b[n_cols])  # the same low-norm heads, counted
    pd.testing.assert_frame_equal(a, b, rtol=1e-4, atol=1e-5)


def test_the_control_depends_on_the_seed_and_the_sample_only(model):
    a, b = _tables(model, 3, seed=0), _tables(model, 3, seed=1)
    ra, rb = (t["ppl"].query("target == 'random'").sort_values(["sample", "scale"]) for t in (a, b))
    assert not ra.nll_sum.reset_index(drop=True).equals(rb.nll_sum.reset_index(drop=True))
    assert sample_uniform(0, "t1") == sample_uniform(0, "t1") != sample_uniform(1, "t1")
    assert sample_uniform(0, "t1") != sample_uniform(0, "t2")


def test_given_uniforms_pick_the_kth_real_candidate():
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    sink = first_real_index(mask, 2, torch.device("cpu"))
    got = random_non_sink_index(sink, 6, position_mask=mask, uniforms=torch.tensor([0.0, 0.999]))
    assert got.tolist() == [3, 5]  # the first candidate after the sink, the last one


def test_sink_vs_control_pairs_texts_per_scale():
    import pandas as pd

    from cwlens.sinks.summary import sink_vs_control

    rows = []
    for i, (sink, rnd) in enumerate([(2.0, 1.0), (3.0, 2.5), (1.0, 1.5), (4.0, 2.0)]):
        rows += [(f"s{i}", "clean", 1.0, 1.0 * 10, 10), (f"s{i}", "sink", 0.0, sink * 10, 10),
                 (f"s{i}", "random", 0.0, rnd * 10, 10)]
    ppl = pd.DataFrame(rows, columns=["sample", "target", "scale", "nll_sum", "n_tokens"])
    got = sink_vs_control(ppl)
    assert list(got) == ["0"]
    d = got["0"]
    assert d["n"] == 4 and d["sink_worse"] == 3
    assert abs(d["mean"] - (1.0 + 0.5 - 0.5 + 2.0) / 4) < 1e-12
    assert d["low"] < d["mean"] < d["high"]
