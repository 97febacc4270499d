"""Integration tier: sink hooks and tables on tiny seeded models (left-padded batches)."""

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.core.sinks import SinkGeometry, first_real_index
from cwlens.engine import adapter, hook_names
from cwlens.engine.batching import pad_batch
from cwlens.engine.handle import wrap
from cwlens.engine.interventions import sinks as hooks
from cwlens.sinks import (
    alignment_statistics,
    cosine_histograms,
    histogram_summary,
    layer_summary,
    ppl_summary,
    sink_norm_intervention,
    sink_statistics,
    sweep_statistics,
)
from cwlens.sinks.sweep import GRID
from cwlens.testing import tiny_model

TEXTS = [
    "the cat sat on the mat",
    "mary gave john a bottle of milk when they went to the store .",
    "paris is the capital of france",
]


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def run(request):
    model = tiny_model(request.param)
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        logits, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
    sink = first_real_index(mask.bool())
    return model, tokens, mask, logits, cache, sink


def forward(model, tokens, mask, fwd_hooks, names=None):
    with torch.no_grad(), hooks.applied(model, fwd_hooks):
        if names is None:
            return model(tokens, attention_mask=mask), None
        return model.run_with_cache(tokens, attention_mask=mask, names_filter=lambda n: n in names)


def test_sink_is_first_real_token(run):
    _, _, mask, _, _, sink = run
    assert sink.tolist() == [int(torch.nonzero(m)[0]) for m in mask]


def test_sweep_at_own_rate_reproduces_the_model(run):
    model, tokens, mask, logits, cache, sink = run
    own = {}
    for ly in range(model.cfg.n_layers):
        geo = adapter.geometry(cache, wrap(model), ly, mask)
        own[ly] = SinkGeometry(geo, sink).alpha0  # per-query rates
    out, _ = forward(model, tokens, mask, hooks.sink_rate_hooks(model, own, sink))
    real = mask.bool()
    assert_close(out[real], logits[real], rtol=1e-5, atol=1e-5)


def test_hooked_sweep_matches_closed_form(run):
    """One layer set to s through the hook: the model's own head outputs follow the curve."""
    model, tokens, mask, _, cache, sink = run
    layer = model.cfg.n_layers - 1
    sg = SinkGeometry(adapter.geometry(cache, wrap(model), layer, mask), sink)
    closed = sg.curve(GRID)
    W_O = wrap(model).W_O(layer).float()
    for si, s in enumerate(GRID.tolist()[::5]):
        _, c = forward(model, tokens, mask, hooks.sink_rate_hooks(model, s, sink, layer),
                       names={hook_names.z(layer)})
        o = torch.einsum("bqhd,hdm->bhqm", c[hook_names.z(layer)].float(), W_O)
        norms = o.norm(dim=-1)
        assert_close(norms[sg.valid], closed[si * 5][sg.valid], rtol=1e-4, atol=1e-5)


def test_sink_value_scale_one_is_identity(run):
    model, tokens, mask, logits, _, sink = run
    out, _ = forward(model, tokens, mask, hooks.sink_value_hooks(model, 1.0, sink))
    assert_close(out, logits, rtol=0, atol=0)


def test_sink_value_scale_zero_removes_exactly_the_sink_term(run):
    model, tokens, mask, _, cache, sink = run
    layer = model.cfg.n_layers - 1  # the last layer: its inputs are unchanged
    geo = adapter.geometry(cache, wrap(model), layer, mask)
    sg = SinkGeometry(geo, sink)
    _, c = forward(model, tokens, mask, hooks.sink_value_hooks(model, 0.0, sink, layer),
                   names={hook_names.z(layer)})
    W_O = geo.W_O
    after = torch.einsum("bqhd,hdm->bqhm", c[hook_names.z(layer)].to(W_O.dtype), W_O)
    sink_vec = torch.einsum("bhd,hdm->bhm", sg.v0, W_O)
    expected = geo.head_outputs() - sg.alpha0.permute(0, 2, 1)[..., None] * sink_vec[:, None]
    real = mask.bool()
    assert_close(after[real], expected[real], rtol=1e-4, atol=1e-5)


def test_hooks_are_removed_even_after_an_exception(run):
    model, tokens, mask, *_ , sink = run
    assert hooks.n_hooks(wrap(model)) == 0

    def boom(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        forward(model, tokens, mask, hooks.sink_value_hooks(model, 0.0, sink) + [
            (hook_names.pattern(0), boom)
        ])
    assert hooks.n_hooks(wrap(model)) == 0


def test_tables_padded_batch_equals_single_runs(run):
    model, tokens, mask, _, cache, _ = run
    stats = sink_statistics(cache, model, mask, sample_ids=["a", "b", "c"])
    for i, sid in enumerate("abc"):
        single = pad_batch(model, [TEXTS[i]])[0]
        with torch.no_grad():
            _, c1 = cwlens.run_with_cache(model, single)
        one = sink_statistics(c1, model, sample_ids=[sid])
        got = stats[stats["sample"] == sid].reset_index(drop=True)
        for col in ("sink_rate", "sink_contribution_intra", "split_tail_cosine", "sink_contribution_inter"):
            assert_close(torch.tensor(got[col].values), torch.tensor(one[col].values),
                         rtol=1e-4, atol=1e-5)


def test_tables_have_the_documented_columns(run):
    model, tokens, mask, _, cache, _ = run
    stats = sink_statistics(cache, model, mask)
    n = model.cfg.n_layers * model.cfg.n_heads * len(TEXTS)
    assert len(stats) == n and stats["sink_rate"].between(0, 1).all()
    assert {"sink_head", "split_tail_attention", "split_sink_relative_norm", "split_tail_contribution"} <= set(stats)
    summary = layer_summary(stats)
    assert len(summary) == model.cfg.n_layers
    align = alignment_statistics(cache, model, mask)
    assert align["cos_value_mean"].between(-1, 1).all()
    hist = histogram_summary(cosine_histograms(cache, model, mask))
    assert set(hist["measure"]) == {"value", "output", "tail_mix"}
    sweep, curves = sweep_statistics(cache, model, mask)
    assert (sweep["swept_max_rel_error"] < 1e-4).all()
    assert (sweep["convex_frac"] == 1).all()
    assert set(sweep["head"]) == set(range(model.cfg.n_heads)) | {-1}


def test_norm_intervention_tables(run):
    model, tokens, mask, *_ = run
    ppl, heads = sink_norm_intervention(model, tokens, mask, scales=(1.0, 0.0))
    summary = ppl_summary(ppl)
    ident = summary[(summary.target == "sink") & (summary.scale == 1.0)]
    assert float(ident["delta_ppl"].iloc[0]) == pytest.approx(0.0, abs=1e-4)
    assert set(heads["target"]) == {"sink", "random"}
    one = heads[heads.scale == 1.0]
    assert_close(torch.tensor(one["norm_after_all"].values), torch.tensor(one["norm_before_all"].values))


def test_streamed_analysis_equals_the_cached_tables(run):
    """``sinks.run.analyse`` streams; its tables equal the cache-based functions'."""
    import pandas as pd

    from cwlens.datasets import TextSample
    from cwlens.sinks import alignment, statistics, sweep
    from cwlens.sinks import run as sink_run

    model, tokens, mask, _, cache, _ = run
    samples = [TextSample(f"s{i}", t, "toy") for i, t in enumerate(TEXTS)]
    got = sink_run.analyse(model, samples, max_tokens=64, batch_size=8, intervention=False,
                           progress=False)
    # analyse sorts by length; rebuild the same batch for the cached reference
    ids, tok, m = sink_run.batches(wrap(model), samples, 64, 8)[0]
    with torch.no_grad():
        _, c = cwlens.run_with_cache(model, tok, attention_mask=m)
    want = {"stats": statistics.sink_statistics(c, model, m, sample_ids=ids)}
    want["alignment"], _ = alignment.alignment_tables(c, model, m, sample_ids=ids)
    want["sweep"], _ = sweep.sweep_statistics(c, model, m, sample_ids=ids, swept=True)
    for key, frame in want.items():
        pd.testing.assert_frame_equal(got[key].reset_index(drop=True), frame, rtol=1e-5, atol=1e-6)
