"""The lockstep path (cwlens.faithfulness.lockstep): row-scope masks ranked per query block
beside the clean stream equal the whole-layer path's masks and numbers exactly, and no
tensor of a whole layer's [batch, head, n, n] size is made on it."""

import pytest
import torch

import cwlens.engine.streaming as streaming
from cwlens.core.metrics import GEOMETRY
from cwlens.datasets import TextSample
from cwlens.engine import adapter
from cwlens.engine.batching import pad_batch, token_ids
from cwlens.engine.handle import wrap
from cwlens.errors import InvalidArgumentError, UnknownOptionError
from cwlens.faithfulness import (
    FaithfulnessConfig,
    job_masks,
    lockstep,
    passes,
    ranking,
    run_faithfulness,
)
from cwlens.testing import tiny_model

DOCS = [TextSample("d-0", "the cat sat on the mat .", "toy"),
        TextSample("d-1", "mary gave john a bottle of milk when they went to the store .", "toy"),
        TextSample("d-2", "one two", "toy")]  # lengths differ: a padded batch
KEYS = ["sample_id", "metric", "mode", "rate", "measure"]


@pytest.fixture(scope="module")
def models():
    return {}


def model_of(models, arch):
    if arch not in models:
        models[arch] = tiny_model(arch)
    return models[arch]


@pytest.fixture
def blockwise(monkeypatch):
    """Short texts run blockwise (the auto rule's threshold lowered) in blocks of 4 queries."""
    monkeypatch.setattr(streaming, "AUTO_THRESHOLD", 2)
    monkeypatch.setattr(streaming, "DEFAULT_QUERY_BLOCK", 4)


def table(model, cfg, path, docs=DOCS):
    cfg = FaithfulnessConfig(**{**cfg.__dict__, "ranking_path": path})
    out = run_faithfulness(model, docs, cfg, progress=False)
    return out.table.sort_values(KEYS).reset_index(drop=True), out.stats


def assert_same_tables(model, cfg, docs=DOCS):
    whole, _ = table(model, cfg, "whole_layer", docs)
    step, stats = table(model, cfg, "lockstep", docs)
    assert len(whole) == len(step) > 0
    assert (whole[KEYS] == step[KEYS]).all().all()
    shares = whole.measure.isin(["tied_share", "first_token_share"])
    # the masks' own counts are exact; NLL, PPL and ΔPPL up to float rounding of a bigger batch
    assert step.value[shares].fillna(-1).tolist() == whole.value[shares].fillna(-1).tolist()
    torch.testing.assert_close(torch.tensor(step.value[~shares].to_numpy()),
                               torch.tensor(whole.value[~shares].to_numpy()), rtol=1e-5, atol=5e-5)  # ppl ~70: 1 ulp 8e-6
    return stats


NON_GRADIENT = tuple(m for m in GEOMETRY if m != "alti") + ("random",)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_lockstep_equals_whole_layer_every_metric(models, blockwise, arch):
    """GQA (llama), sliding windows (gemma3), learned positions (gpt2); a padded batch in
    query blocks of 4; every non-gradient metric, both modes, several rates."""
    cfg = FaithfulnessConfig(metrics=NON_GRADIENT, rates=(0.1, 0.3, 0.5, 1.0), batch_tokens=10_000)
    stats = assert_same_tables(model_of(models, arch), cfg)
    assert stats.n_batches == 1


def test_lockstep_equals_whole_layer_alti(models, blockwise):
    cfg = FaithfulnessConfig(metrics=("alti",), rates=(0.3,), batch_tokens=10_000)
    assert_same_tables(model_of(models, "llama"), cfg)


@pytest.mark.parametrize("options", [
    {"renormalize": True}, {"causal_only": False}, {"mask_first_token": False},
    {"kind": "intra", "layers": (1,)}, {"per_layer": True, "reuse": False},
])
def test_lockstep_equals_whole_layer_options(models, blockwise, options):
    cfg = FaithfulnessConfig(metrics=("contribution", "random", "value_weighted_output_normalized"),
                             rates=(0.3, 0.5), batch_tokens=10_000, **options)
    assert_same_tables(model_of(models, "llama"), cfg)


def test_lockstep_under_eager_attention_equals_whole_layer(models):
    """Forced on short texts (no blockwise): each layer is one block."""
    cfg = FaithfulnessConfig(metrics=("contribution", "attention", "random"), rates=(0.3,),
                             batch_tokens=10_000)
    assert_same_tables(model_of(models, "llama"), cfg)


def test_lockstep_masks_equal_whole_layer_masks(models, blockwise, monkeypatch):
    """The masks themselves, entry by entry: the whole-layer path's packed masks against
    the blocks the lockstep path applies, reassembled."""
    model = model_of(models, "llama")
    cfg = FaithfulnessConfig(metrics=("contribution", "random", "attention"), rates=(0.3, 1.0),
                             batch_tokens=10_000)
    whole: dict = {}
    real_layer_masks = passes.layer_masks

    def keep_layer(geo, layer, plan, window=None):
        out = real_layer_masks(geo, layer, plan, window)
        whole.update({(layer, key): m.unpack() for key, m in out.items()})
        return out

    monkeypatch.setattr(passes, "layer_masks", keep_layer)
    table(model, cfg, "whole_layer")
    tokens, mask = pad_batch(model, [d.text for d in DOCS])
    b, n = tokens.shape
    blocks: dict = {}
    real_block = lockstep._Lockstep._block_masks

    def keep_block(self, layer, clean, start, n_keys):
        out = real_block(self, layer, clean, start, n_keys)
        for key, m in out.items():
            full = blocks.setdefault((layer, key), torch.zeros(b, m.shape[1], n, n, dtype=torch.bool))
            full[:, :, start : start + m.shape[2], : m.shape[3]] = m
        return out

    monkeypatch.setattr(lockstep._Lockstep, "_block_masks", keep_block)
    table(model, cfg, "lockstep")
    assert sorted(blocks, key=str) == sorted(whole, key=str) and len(whole) == 2 * (3 * 2 + 1)  # layers x (metrics x modes + rate 1)
    for k, m in whole.items():
        assert torch.equal(blocks[k], m), k
        assert 0 < int(m.sum()) < m.numel()


LONG = TextSample("long", " ".join(["the cat sat on the mat and the dog ran to the red house ."] * 4), "toy")


def test_lockstep_makes_no_whole_layer_tensor(models, monkeypatch):
    """At 57 tokens in blocks of 8 queries, every tensor the ranking, the geometry, the
    masking and the pattern hook get is far below one layer's [batch, head, n, n]; the
    whole-layer path does make it (so the check can fail)."""
    monkeypatch.setattr(streaming, "AUTO_THRESHOLD", 16)
    monkeypatch.setattr(streaming, "DEFAULT_QUERY_BLOCK", 8)
    monkeypatch.setattr(lockstep, "RANK_ENTRIES", 4 * 4 * 57)  # 4 rows per ranking sub-block
    model = model_of(models, "llama")
    n = len(token_ids(model, LONG.text))
    assert n > 50
    layer_size = 1 * 4 * n * n
    seen: list[int] = []

    def spy(module, name):
        real = getattr(module, name)

        def wrapped(*args, **kwargs):
            seen.extend(a.numel() for a in [*args, *kwargs.values()] if isinstance(a, torch.Tensor))
            out = real(*args, **kwargs)
            for t in out if isinstance(out, tuple) else (out,):
                t = getattr(t, "pattern", getattr(t, "rank", t))  # a geometry, a Ranking
                seen.extend([t.numel()] if isinstance(t, torch.Tensor) else [])
            return out

        monkeypatch.setattr(module, name, wrapped)

    for name in ("metric_scores", "eligible_rows", "random_scores", "tiebreak_scores",
                 "remove_entries"):
        spy(lockstep, name)
    for name in ("rank_entries", "mask_counts"):  # both paths rank in job_masks
        spy(job_masks, name)
    spy(adapter, "layer_geometry")
    spy(lockstep._Lockstep, "_geometry")
    cfg = FaithfulnessConfig(metrics=("contribution", "random"), rates=(0.3,), max_tokens=None)
    assert _use_lockstep(model, torch.zeros(1, n, dtype=torch.long), cfg, cfg.metrics)
    run_faithfulness(model, [LONG], cfg, progress=False)
    assert seen and max(seen) <= 2 * 4 * 8 * n < layer_size / 3  # pattern hook: (1 + 1) copies x 8 rows
    seen.clear()
    run_faithfulness(model, [LONG], FaithfulnessConfig(**{**cfg.__dict__, "ranking_path": "whole_layer"}),
                     progress=False)
    assert max(seen) >= layer_size


def _use_lockstep(model, tokens, cfg, job_metrics):
    """The sweep's rule on one batch: lockstep where "auto" attention runs it blockwise."""
    return lockstep.use_lockstep(streaming.use_blockwise(wrap(model), tokens, "auto"), cfg, job_metrics)


def test_auto_rule(models, monkeypatch):
    model = model_of(models, "llama")
    monkeypatch.setattr(streaming, "AUTO_THRESHOLD", 10)
    short, long = torch.zeros(1, 10, dtype=torch.long), torch.zeros(1, 11, dtype=torch.long)
    row = FaithfulnessConfig()
    assert not _use_lockstep(model, short, row, row.metrics)
    assert _use_lockstep(model, long, row, row.metrics)
    for cfg, metrics in [(FaithfulnessConfig(scope="head"), row.metrics),
                         (FaithfulnessConfig(ranking_path="whole_layer"), row.metrics),
                         (row, ("contribution", "attention_gradient"))]:
        assert not _use_lockstep(model, long, cfg, metrics)
    assert _use_lockstep(model, short, FaithfulnessConfig(ranking_path="lockstep"), row.metrics)


def test_lockstep_refusals(models):
    model = model_of(models, "llama")
    tokens = torch.zeros(1, 5, dtype=torch.long)
    with pytest.raises(InvalidArgumentError, match="scope='row'.*ranking_path='auto'.*--ranking-path auto"):
        _use_lockstep(model, tokens, FaithfulnessConfig(ranking_path="lockstep", scope="layer"), ())
    with pytest.raises(InvalidArgumentError, match="attention_gradient.*ranking_path='whole_layer'.*--ranking-path whole_layer"):
        _use_lockstep(model, tokens, FaithfulnessConfig(ranking_path="lockstep"),
                              ("contribution", "attention_gradient"))
    with pytest.raises(UnknownOptionError, match="ranking_path='sideways'.*'lockstep'"):
        FaithfulnessConfig(ranking_path="sideways")


@pytest.mark.parametrize("pad", [0, 3, "hole"])
def test_block_draws_and_eligibility_equal_the_whole_layer_slices(pad):
    """Pure: the tie-break, the random control and the eligible entries of a block of rows
    are the whole layer's same entries, as defined on the real positions (left padding,
    a window, the first token protected)."""
    n, b, h, window = 13, 2, 3, 5
    mask = torch.ones(b, n, dtype=torch.long)
    if pad == "hole":  # real positions not contiguous
        mask[1, 4] = 0
    else:
        mask[1, :pad] = 0
    keys = ["a", "b"]
    whole_r = torch.zeros(b, h, n, n)
    whole_t = torch.zeros(b, h, n, n)
    for row, key in enumerate(keys):
        idx = mask[row].nonzero().flatten()
        whole_r[row][:, idx[:, None], idx[None, :]] = ranking.position_uniforms(h, len(idx), f"7:{key}:1").float()
        whole_t[row][:, idx[:, None], idx[None, :]] = ranking.position_uniforms(h, len(idx), "ties:7:1").float()
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    real = mask.bool()
    whole_e = (real[:, None, :, None] & real[:, None, None, :] & (j <= i) & (i - j < window)
               & (j != real.int().argmax(-1)[:, None, None, None]))
    assert torch.equal(ranking.eligible_entries(mask, True, False, window), whole_e)
    for start, rows, stop in [(0, 4, 4), (4, 4, 8), (8, 5, 13), (3, 2, 13), (0, 13, 13)]:
        shape = (b, h, rows, stop)
        assert torch.equal(ranking.random_scores(shape, mask, keys, 7, 1, start),
                           whole_r[:, :, start : start + rows, :stop])
        assert torch.equal(ranking.tiebreak_scores(shape, mask, keys, 7, 1, start),
                           whole_t[:, :, start : start + rows, :stop])
        assert torch.equal(ranking.eligible_rows(mask, ranking.RowBlock(start, rows, stop), True, False, window),
                           whole_e[:, :, start : start + rows, :stop])


def test_cli_ranking_path_flag(tmp_path, capsys):
    """--ranking-path reaches the configuration: both paths write the same rows; the
    resumed run does not care which path wrote them; a bad value is a usage error."""
    import json

    from cwlens.cli.main import main
    from cwlens.testing import save_tiny

    model_dir = save_tiny("llama", tmp_path)
    text = tmp_path / "doc.txt"
    text.write_text(DOCS[1].text)
    rows = {}
    for path in ("whole_layer", "lockstep"):
        out = tmp_path / path
        argv = ["faithfulness", "--model", str(model_dir), "--device", "cpu", "--file", str(text),
                "--rates", "0.5", "--metrics", "contribution,random", "--ranking-path", path,
                "--out", str(out), "--figures", "", "--no-progress"]
        assert main(argv) == 0
        rows[path] = [json.loads(line) for line in (out / "file_doc.jsonl").read_text().splitlines()]
    assert len(rows["lockstep"]) == len(rows["whole_layer"]) > 0
    for a, b in zip(rows["lockstep"], rows["whole_layer"], strict=True):
        assert {k: v for k, v in a.items() if k != "value"} == {k: v for k, v in b.items() if k != "value"}
        assert a["value"] == pytest.approx(b["value"], rel=1e-5, abs=5e-5, nan_ok=True)
    done = (tmp_path / "whole_layer" / "file_doc.jsonl").read_text()
    argv[argv.index("--out") + 1] = str(tmp_path / "whole_layer")  # lockstep resumes it: nothing to do
    assert main(argv) == 0
    assert (tmp_path / "whole_layer" / "file_doc.jsonl").read_text() == done
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["faithfulness", "--ranking-path", "sideways"])
    assert exit_.value.code == 2
    assert "--ranking-path" in capsys.readouterr().err
