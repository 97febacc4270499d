"""#39.6 One name, one quantity: the sink columns of :class:`cwlens.reducers.HeadSummary`
and :func:`cwlens.sinks.sink_statistics` are the same numbers under the same names, each
name is defined once in docs/sinks.md, and tables with the old names are upgraded."""

import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.core.geometry import AttentionGeometry
from cwlens.core.sinks import key_contribution
from cwlens.engine import reducers
from cwlens.engine.batching import pad_batch
from cwlens.sinks import head_summary, layer_summary, sink_statistics
from cwlens.sinks.store import TABLES, load_tables, save_tables, upgrade_columns, upgrade_folder
from cwlens.testing import tiny_model

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["the cat sat", "mary gave john a bottle of milk when they went to the store .",
         "paris is the capital of france"]
SHARED = ("sink_rate", "sink_contribution_intra", "sink_contribution_inter")
TOL = dict(rtol=1e-4, atol=2e-6)


def _both(model, texts, query_block=None):
    """``HeadSummary`` (streamed, in blocks) and ``sink_statistics`` on the same padded batch,
    as two ``[layer, batch, head]`` tensors per shared column."""
    tokens, mask = pad_batch(model, texts)
    heads = cwlens.stream_reduce(model, tokens, [reducers.HeadSummary()], attention_mask=mask,
                                 query_block=query_block)["heads"]
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
    stats = sink_statistics(cache, model, mask).sort_values(["layer", "sample", "head"])
    n_l, b, h = heads.sink_rate.shape
    table = {c: torch.tensor(stats[c].to_numpy()).double().view(n_l, b, h) for c in SHARED}
    return heads, table


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen3", "bert"])
def test_head_summary_and_sink_statistics_agree_on_every_shared_name(arch):
    """Left-padded decoders (GQA in qwen3/llama), a right-padded encoder; query blocks of 2."""
    heads, table = _both(tiny_model(arch), TEXTS, query_block=2)
    for name in SHARED:
        assert_close(getattr(heads, name).double(), table[name], **TOL, msg=lambda m, name=name: f"{name}: {m}")
    frame = heads.to_dataframe()
    assert set(SHARED) <= set(frame.columns) and "sink_contribution" not in frame.columns


def test_the_names_agree_on_smollm2(smollm2):
    """The issue's case (L10H8 of SmolLM2: a sink rate of 0.029 vs 0.002, a sink
    contribution of 0.060 vs 0.322 under one name) now gives one number per name."""
    texts = ["Natalia sold clips to 48 of her friends in April, and then she sold half.",
             "The sun is a star."]
    heads, table = _both(smollm2, texts)
    for name in SHARED:
        assert_close(getattr(heads, name).double(), table[name], **TOL, msg=lambda m, name=name: f"{name}: {m}")
    # the two contributions are different quantities: intra is a share of the head's output
    assert (heads.sink_contribution_intra - heads.sink_contribution_inter).abs().max() > 0.1


def test_the_sink_query_is_left_out_of_every_head_mean():
    """In a decoder the sink's own query puts all its attention on itself: counting it (the
    old HeadSummary) raised a head's sink rate by (1 - rate) / n."""
    model = tiny_model("llama")
    heads, _ = _both(model, ["the cat sat on the mat"])
    tokens = model.to_tokens("the cat sat on the mat")
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens)
    a = torch.stack([cache[f"blocks.{ly}.attn.hook_pattern"][0, :, :, 0]
                     for ly in range(model.cfg.n_layers)])  # [L, h, q]
    assert_close(heads.sink_rate[:, 0], a[..., 1:].mean(-1), **TOL)
    ent = torch.stack([-(p * p.clamp_min(1e-30).log()).sum(-1) for p in
                       (cache[f"blocks.{ly}.attn.hook_pattern"][0] for ly in range(model.cfg.n_layers))])
    assert_close(heads.entropy[:, 0], ent[..., 1:].mean(-1), **TOL)


def test_the_intra_column_is_intra_whatever_the_kind():
    """sink_statistics(kind="inter") used to overwrite its intra sink contribution with the
    factor split's inter one; the split is now ``split_*`` and the kind column says which."""
    model = tiny_model("llama")
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
    intra = sink_statistics(cache, model, mask, kind="intra")
    inter = sink_statistics(cache, model, mask, kind="inter")
    for name in SHARED:
        assert_close(torch.tensor(inter[name].values), torch.tensor(intra[name].values), **TOL)
    assert_close(torch.tensor(intra["split_sink_contribution"].values),
                 torch.tensor(intra["sink_contribution_intra"].values), **TOL)
    assert_close(torch.tensor(inter["split_sink_contribution"].values),
                 torch.tensor(inter["sink_contribution_inter"].values), **TOL)


@pytest.mark.parametrize("kind", ["intra", "inter"])
def test_key_contribution_is_a_column_of_the_contribution(kind):
    """Per row a different key (left padding), GQA, a block of rows with fewer keys."""
    g = torch.Generator().manual_seed(0)
    b, h, kv, n, d = 3, 4, 2, 7, 5
    pattern = torch.rand(b, h, n, n, generator=g).tril()
    pattern = pattern / pattern.sum(-1, keepdim=True)
    v = torch.randn(b, n, kv, d, generator=g, dtype=torch.float64).float()
    W_O = torch.randn(h, d, 6, generator=g)
    mask = torch.ones(b, n, dtype=torch.bool)
    mask[1, :2] = False
    geo = AttentionGeometry(pattern, v, W_O, position_mask=mask)
    index = torch.tensor([0, 2, 4])
    full = geo.contribution(kind)
    want = full.gather(-1, index[:, None, None, None].expand(b, h, n, 1))[..., 0]
    assert_close(key_contribution(geo, index, kind), want, rtol=1e-5, atol=1e-6)
    block = geo.rows(1, 3, key_stop=3)  # queries 1, 2 over keys 0..2: key 4 lies past them
    got = key_contribution(block, index, kind)
    assert_close(got[:2], want[:2, :, 1:3], rtol=1e-5, atol=1e-6)
    assert (got[2] == 0).all()


def _doc_columns() -> dict[str, int]:
    """Column names in the first column of docs/sinks.md's "Columns" table, with counts."""
    text = (ROOT / "docs" / "sinks.md").read_text(encoding="utf-8")
    section = text.split("\n## Columns", 1)[1].split("\n## ", 1)[0]
    counts: dict[str, int] = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*`([a-z_*]+)`", line)
        if m:
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def test_docs_define_every_column_once():
    model = tiny_model("gpt2")
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
    stats = sink_statistics(cache, model, mask)
    heads = cwlens.stream_reduce(model, tokens, [reducers.HeadSummary()],
                                 attention_mask=mask)["heads"].to_dataframe()
    columns = set(stats) | set(head_summary(stats)) | set(layer_summary(stats)) | set(heads)
    columns -= {"sample", "layer", "head"}
    documented = _doc_columns()
    assert {c: n for c, n in documented.items() if n > 1} == {}
    split = {c for c in columns if c.startswith("split_")}
    assert columns - split <= set(documented), sorted(columns - split - set(documented))
    assert {"split_sink_*", "split_tail_*"} <= set(documented)
    assert split == {f"split_{w}_{f}" for w in ("sink", "tail")
                     for f in ("attention", "relative_norm", "cosine", "contribution")}


def _old_names(df: pd.DataFrame) -> pd.DataFrame:
    """A table as ``cwlens sinks`` wrote it before #39.6 (same values, old names and order)."""
    per_head = "sink_contribution_inter" in df
    out = df.drop(columns=["split_sink_contribution"]) if per_head else df
    ren = {"sink_contribution_intra": "sink_contribution", "split_sink_contribution": "sink_contribution",
           "sink_contribution_intra_median": "sink_contribution_median"}
    ren.update({c: c.removeprefix("split_") for c in out.columns if c.startswith("split_") and c not in ren})
    return out.rename(columns=ren)


def test_old_tables_are_upgraded_on_reading_and_on_disk(tmp_path):
    model = tiny_model("llama")
    tokens, mask = pad_batch(model, TEXTS)
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
    stats = sink_statistics(cache, model, mask)
    new = {"stats": stats, "heads": head_summary(stats), "layers": layer_summary(stats)}
    old = {k: _old_names(v) for k, v in new.items()}
    assert "sink_contribution" in old["stats"] and "split_tail_cosine" not in old["stats"]
    for k in new:
        pd.testing.assert_frame_equal(upgrade_columns(old[k]), new[k], check_dtype=False)
        assert upgrade_columns(new[k]) is new[k]
    # a folder of old tables: read with the new names, then rewritten on disk
    blank = pd.DataFrame({"layer": [0]})
    tables = {**old, **{k: blank for k in ("sweep", "curves", "histograms")}}
    save_tables(tables, tmp_path)
    got = load_tables(tmp_path)
    pd.testing.assert_frame_equal(got["heads"], new["heads"], check_dtype=False, atol=1e-6)
    done = upgrade_folder(tmp_path)
    assert sorted(p.name for p in done) == sorted(TABLES[k] for k in ("stats", "heads", "layers"))
    header = (tmp_path / TABLES["stats"]).read_text().splitlines()[0].split(",")
    assert header == list(new["stats"].columns)
    assert upgrade_folder(tmp_path) == []  # already current
    again = load_tables(tmp_path)  # the manifest's checksums were updated
    pd.testing.assert_frame_equal(again["layers"], got["layers"])
