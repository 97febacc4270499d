"""Sliding-window layers: entries outside a layer's window are not eligible for masking.

Such entries have alpha = 0 (the model never attends there); counting them as eligible
makes every ranking end in a block of ties and dilutes the removal rate.
"""

import torch

import cwlens
from cwlens.engine import hook_names
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.faithfulness.passes import SweepStats, _layer_masks
from cwlens.faithfulness.ranking import eligible_entries
from cwlens.faithfulness.sweep import FaithfulnessConfig
from cwlens.testing import tiny_model

TEXTS = ["the cat sat on the mat and the dog ran fast to the big red house",
         "paris is the capital of france"]


def test_adapter_reports_each_layers_window():
    gemma = tiny_model("gemma3")  # layer 0 sliding (window 8), layer 1 global
    assert wrap(gemma).attention_window(0) == 8
    assert wrap(gemma).attention_window(1) is None
    assert wrap(tiny_model("llama")).attention_window(0) is None


def test_window_makes_far_keys_ineligible():
    mask = torch.ones(1, 6, dtype=torch.bool)
    elig = eligible_entries(mask, window=3)[0, 0]
    i, j = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    assert torch.equal(elig, (j <= i) & (i - j < 3))


def test_eligible_entries_are_where_the_model_can_attend():
    model = tiny_model("gemma3")
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
    cfg = FaithfulnessConfig(rates=(1.0,))
    jobs = {"all": (None, "comprehensiveness", 1.0, (0, 1))}  # rate 1: every eligible entry
    _, masks = cwlens.stream_geometry(
        model, tokens, lambda ly, geo: _layer_masks(geo, ly, mask, jobs, cfg, ["a", "b"], SweepStats(),
                                                    wrap(model).attention_window(ly)),
        attention_mask=mask,
    )
    for ly in (0, 1):
        pattern = cache[hook_names.pattern(ly)]
        can_attend = (pattern > 0) & mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]
        assert torch.equal(masks[ly]["all"].unpack(), can_attend), ly
