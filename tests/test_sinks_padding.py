"""Sink tables on padded batches equal unpadded single runs (left and right padding).

The sink of a row is its first real token and only real queries count, whatever the
padding side: decoders are left-padded, encoders right-padded by ``pad_batch``.
"""

import pandas as pd
import pytest
import torch
from pandas.testing import assert_frame_equal

import cwlens
from cwlens.core.sinks import SinkGeometry, first_real_index, random_non_sink_index
from cwlens.engine import adapter
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.sinks import alignment_statistics, sink_statistics
from cwlens.testing import tiny_model

TEXTS = ["the cat sat", "mary gave john a bottle of milk when they went to the store ."]


@pytest.fixture(scope="module", params=["bert", "llama"])
def model(request):
    return tiny_model(request.param)


def _tables(model, texts, ids):
    tokens, mask = pad_batch(model, texts)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
    return (sink_statistics(cache, model, mask, sample_ids=ids),
            alignment_statistics(cache, model, mask, sample_ids=ids))


@pytest.mark.parametrize("which", [0, 1])
def test_padded_batch_equals_single_runs(model, which):
    batch = [t[t["sample"] == which].reset_index(drop=True)
             for t in _tables(model, TEXTS, [0, 1])]
    alone = _tables(model, [TEXTS[which]], [which])
    for got, want in zip(batch, alone, strict=True):
        assert_frame_equal(got, want.reset_index(drop=True), check_dtype=False,
                           rtol=1e-4, atol=1e-5)


def test_short_row_counts_only_its_real_queries(model):
    stats, _ = _tables(model, TEXTS, [0, 1])
    tokens, mask = pad_batch(model, TEXTS)
    n_real = mask.sum(-1)
    assert (stats.query("sample == 0").n_queries == int(n_real[0]) - 1).all()
    assert (stats.query("sample == 1").n_queries == int(n_real[1]) - 1).all()


def test_sink_geometry_valid_only_on_real_queries(model):
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
    geo = adapter.geometry(cache, wrap(model), 0, mask)
    sg = SinkGeometry(geo, first_real_index(mask.bool()))
    assert not (sg.valid & ~mask.bool()[:, None, :]).any()


def test_random_control_lands_on_a_real_token():
    mask = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1, 1, 1]]).bool()
    sink = first_real_index(mask)
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        idx = random_non_sink_index(sink, 8, gen, position_mask=mask)
        assert mask[torch.arange(2), idx].all() and (idx != sink).all()
    seen = pd.Series([int(random_non_sink_index(sink, 8, gen, position_mask=mask)[0])
                      for _ in range(200)])
    assert set(seen) == {1, 2}  # uniform over the real non-sink tokens of row 0
