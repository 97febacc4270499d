"""Long-text faithfulness ranks per query block (issue #42.3): the sweep on a text of a few
hundred tokens, past the tiny model's context (``past_context``), every layer masked,
ranked per query block on the lockstep path (blockwise attention in blocks of 16 queries,
the ends-only ranking of each row: ``partial_ranking``), equals the whole-layer path with
every row sorted whole (``rank_entries``, the ranking the ends-only one replaces): every
mask entry by entry, the tie / first-token counts exactly and NLL / PPL / ΔPPL to float
rounding."""

import pytest
import torch

import cwlens.engine.streaming as streaming
from cwlens.datasets import TextSample
from cwlens.engine import native
from cwlens.faithfulness import FaithfulnessConfig, lockstep, passes, run_faithfulness
from cwlens.faithfulness import job_masks as jm
from cwlens.testing import tiny_model

LONG = TextSample("long", " ".join(["the cat sat on the mat and the dog ran to the red house ."] * 20), "toy")
KEYS = ["sample_id", "metric", "mode", "rate", "measure"]


@pytest.mark.parametrize("kernel", [False, True])
def test_long_text_every_layer_per_block_equals_the_whole_layer_sort(monkeypatch, kernel):
    """kernel: the lockstep blocks' masks from the C kernel (native_masks) instead of the
    ends-only torch ranking."""
    if kernel and not native.available():
        pytest.skip("the C kernel is not built here (no compiler)")
    model = tiny_model("llama")
    cfg = FaithfulnessConfig(metrics=("contribution", "random"), rates=(0.1, 0.3),
                             modes=("comprehensiveness",), max_tokens=None, past_context=True,
                             batch_tokens=100_000)
    n = int(model.to_tokens(LONG.text, truncate=False).shape[-1])
    assert n > 2 * model.cfg.n_ctx and n >= 250  # a few hundred tokens, past the context
    whole_masks: dict = {}
    real_layer_masks = passes.layer_masks

    def keep_layer(geo, layer, plan, window=None):
        out = real_layer_masks(geo, layer, plan, window)
        whole_masks.update({(layer, key): m.unpack() for key, m in out.items()})
        return out

    # the base code's ranking: every row sorted whole, with the tie-break
    with monkeypatch.context() as m:
        m.setattr(passes, "layer_masks", keep_layer)
        m.setattr(jm, "worth_it", lambda *a: False)
        m.setenv("CWLENS_NATIVE", "0")
        whole = run_faithfulness(model, [LONG], FaithfulnessConfig(**{**cfg.__dict__, "ranking_path": "whole_layer"}),
                                 progress=False).table
    monkeypatch.setattr(streaming, "AUTO_THRESHOLD", 2)  # blockwise
    monkeypatch.setattr(streaming, "DEFAULT_QUERY_BLOCK", 16)
    block_masks: dict = {}
    real_block = lockstep._Lockstep._block_masks

    def keep_block(self, layer, clean, start, n_keys):
        out = real_block(self, layer, clean, start, n_keys)
        for key, mk in out.items():
            full = block_masks.setdefault((layer, key), torch.zeros(1, mk.shape[1], n, n, dtype=torch.bool))
            full[:, :, start : start + mk.shape[2], : mk.shape[3]] = mk
        return out

    monkeypatch.setattr(lockstep._Lockstep, "_block_masks", keep_block)
    monkeypatch.setenv("CWLENS_NATIVE", "1" if kernel else "0")
    ends_only = []
    real_partial = jm.rank_rows_partially
    monkeypatch.setattr(jm, "rank_rows_partially", lambda *a: ends_only.append(1) or real_partial(*a))
    by_kernel = []
    real_kernel = native.row_masks
    monkeypatch.setattr(native, "row_masks", lambda *a: by_kernel.append(1) or real_kernel(*a))
    step = run_faithfulness(model, [LONG], FaithfulnessConfig(**{**cfg.__dict__, "ranking_path": "lockstep"}),
                            progress=False).table
    assert (by_kernel and not ends_only) if kernel else (ends_only and not by_kernel)
    assert sorted(block_masks, key=str) == sorted(whole_masks, key=str)
    assert len(whole_masks) == model.cfg.n_layers * 2 * 2  # every layer, 2 metrics x 2 rates
    for k, mk in whole_masks.items():
        assert torch.equal(block_masks[k], mk), k
        assert 0 < int(mk.sum()) < mk.numel()
    whole = whole.sort_values(KEYS).reset_index(drop=True)
    step = step.sort_values(KEYS).reset_index(drop=True)
    assert len(whole) == len(step) > 0 and (whole[KEYS] == step[KEYS]).all().all()
    shares = whole.measure.isin(["tied_share", "first_token_share"])
    assert step.value[shares].fillna(-1).tolist() == whole.value[shares].fillna(-1).tolist()
    torch.testing.assert_close(torch.tensor(step.value[~shares].to_numpy()),
                               torch.tensor(whole.value[~shares].to_numpy()), rtol=1e-5, atol=5e-5)
