"""The C kernel's row-scope masks (cwlens.faithfulness.native_masks) equal the torch
ranking's masks and counts bit for bit: ties in the scores (across the cut and inside
it), equal keys (equal score and equal tie-break draw: key order decides), padding,
sliding windows, the first token kept, both modes, every rate; rows with holes and NaN
scores go to torch; a whole sweep writes the same numbers with and without the kernel."""

from types import SimpleNamespace

import pytest
import torch

from cwlens.core.bitmask import PackedMask
from cwlens.engine import native
from cwlens.faithfulness import job_masks as jm
from cwlens.faithfulness import native_masks

from ._ranking_cases import tied_rows

pytestmark = pytest.mark.skipif(not native.available(), reason="the C kernel is not built here (no compiler)")

RATES = (0.0, 0.04, 0.1, 0.3, 0.5, 0.77, 1.0)


def _jobs(metrics=("a", "b"), rates=RATES):
    out = [((m, r, mode), SimpleNamespace(metric=m, rate=r, mode=mode))
           for m in metrics for r in rates for mode in ("comprehensiveness", "sufficiency")]
    out.append((("all",), SimpleNamespace(metric=None, rate=1.0, mode="comprehensiveness")))
    return out


def _both(jobs, piece, monkeypatch, scope="row"):
    """job_masks with the kernel and without: ({key: bool mask}, counts) each."""
    out = []
    for on in (True, False):
        monkeypatch.setenv("CWLENS_NATIVE", "1" if on else "0")
        counts: dict = {}
        kinds = set()
        masks = {}
        for k, m in jm.job_masks(jobs, piece, scope, counts):
            kinds.add(type(m))
            masks[k] = (m.unpack() if isinstance(m, PackedMask) else m.expand(piece.shape)).clone()
        out.append((masks, {k: v.tolist() for k, v in counts.items()}, kinds))
    return out


@pytest.mark.parametrize("seed, levels", [(0, 1), (1, 2), (2, 3), (3, 7), (4, 100000)])
@pytest.mark.parametrize("mask_first, window", [(True, None), (False, None), (True, 4), (False, 7)])
def test_kernel_masks_and_counts_equal_the_torch_ranking(seed, levels, mask_first, window, monkeypatch):
    scores, eligible, tb, first = tied_rows(seed, levels, mask_first, window, 40)
    if seed == 1:  # equal keys: every tie-break draw the same, key order decides
        tb = torch.zeros_like(tb)
    if seed == 2:
        scores = -scores  # negative scores (and -0.0: equal to 0.0)
    piece = jm.Piece(scores.shape, eligible, first, lambda m: scores if m == "a" else scores.flip(-1), lambda: tb)
    (got, c_got, kinds), (want, c_want, _) = _both(_jobs(), piece, monkeypatch)
    assert PackedMask in kinds  # the kernel ran
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert c_got == c_want
    if levels <= 3:  # ties at the cut: some entries chosen by the tie-break
        assert any(v[1] > 0 for c in c_want.values() for v in c)


def test_long_rows_and_many_heads(monkeypatch):
    g = torch.Generator().manual_seed(0)
    b, h, q, w = 2, 3, 5, 3000
    scores = torch.randint(0, 50, (b, h, q, w), generator=g).float()
    position = torch.ones(b, w, dtype=torch.bool)
    position[1, :17] = False
    from cwlens.faithfulness.ranking import RowBlock, eligible_rows, first_token, tiebreak_scores

    block = RowBlock(w - q, q, w)  # the last rows of a long text (a lockstep block)
    eligible = eligible_rows(position, block, True, True, None)
    tb = tiebreak_scores((b, h, q, w), position, ["x", "y"], 3, 1, block.query_start)
    piece = jm.Piece((b, h, q, w), eligible, first_token(position), lambda m: scores, lambda: tb)
    (got, c_got, _), (want, c_want, _) = _both(_jobs(("a",)), piece, monkeypatch)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert c_got == c_want


def test_rows_with_holes_and_nan_scores_go_to_torch(monkeypatch):
    scores, eligible, tb, first = tied_rows(0, 5, True, None, 12)
    holes = eligible.clone()
    holes[..., 3] = False  # key 3 left out of every row: rows of two runs
    assert native_masks.eligible_ranges(holes, scores.shape) is None
    assert native_masks.row_masks_of(_jobs(("a",))[:2], scores, tb, holes, first) is None
    bad = scores.clone()
    bad[0, 0, 5, 2] = float("nan")
    assert native_masks.row_masks_of(_jobs(("a",))[:2], bad, tb, eligible, first) is None
    assert native_masks.row_masks_of(_jobs(("a",))[:2], scores, tb, eligible, first) is not None
    outside = scores.clone()
    outside[0, 0, 2, 5] = float("nan")  # a key after its query: not eligible, never ranked
    assert native_masks.row_masks_of(_jobs(("a",))[:2], outside, tb, eligible, first) is not None
    piece = jm.Piece(scores.shape, holes, first, lambda m: scores, lambda: tb)
    (got, c_got, kinds), (want, c_want, _) = _both(_jobs(("a",)), piece, monkeypatch)
    assert PackedMask not in kinds
    assert all(torch.equal(got[k], want[k]) for k in want) and c_got == c_want


def test_head_and_layer_scopes_stay_with_torch(monkeypatch):
    scores, eligible, tb, first = tied_rows(0, 5, True, None, 12)
    piece = jm.Piece(scores.shape, eligible, first, lambda m: scores, lambda: tb)
    for scope in ("head", "layer"):
        (_, _, kinds), _ = _both(_jobs(("a",), (0.3,)), piece, monkeypatch, scope)
        assert PackedMask not in kinds


@pytest.mark.parametrize("path", ["whole_layer", "lockstep"])
def test_a_sweep_writes_the_same_numbers_with_and_without_the_kernel(path, monkeypatch):
    """Every metric, both modes, on a tiny llama: the results tables equal (whole-layer
    ranking and the lockstep path's per-block ranking)."""
    from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
    from cwlens.testing import tiny_model

    model = tiny_model("llama", "bridge")
    cfg = FaithfulnessConfig(rates=(0.1, 0.3, 0.6), max_tokens=24, batch_tokens=48, ranking_path=path)
    tables, kernel = [], []
    real = native.row_masks
    monkeypatch.setattr(native, "row_masks", lambda *a: kernel.append(1) or real(*a))
    for on in (True, False):
        monkeypatch.setenv("CWLENS_NATIVE", "1" if on else "0")
        tables.append(run_faithfulness(model, "gsm8k", cfg, n=4, progress=False).table)
    assert kernel  # the kernel ranked in the first run
    assert tables[0].equals(tables[1])


@pytest.mark.parametrize("attention", ["eager", "blockwise"])
def test_packed_masks_applied_by_the_kernel_give_the_same_logits(attention, monkeypatch):
    """run_masked with PackedMask masks: the kernel's zeroing (value_masking._zero_packed)
    and unpack + multiply give the very same logits, whole layers and query blocks (with
    a left-padded batch); renormalize stays with torch."""
    from cwlens.engine import streaming
    from cwlens.engine.interventions.value_masking import run_masked
    from cwlens.testing import tiny_model

    model = tiny_model("llama")
    monkeypatch.setattr(streaming, "DEFAULT_QUERY_BLOCK", 3)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 50, (2, 11), generator=g)
    position = torch.ones(2, 11, dtype=torch.long)
    position[1, :4] = 0
    h = model.cfg.n_heads
    masks = {ly: PackedMask.pack(torch.rand(2, h, 11, 11, generator=g) < 0.3) for ly in range(model.cfg.n_layers)}
    zeroed = []
    real = native.zero_masked
    monkeypatch.setattr(native, "zero_masked", lambda *a: zeroed.append(1) or real(*a))
    out = {}
    for on in (True, False):
        monkeypatch.setenv("CWLENS_NATIVE", "1" if on else "0")
        for renorm in (False, True):
            out[on, renorm] = run_masked(model, tokens, masks, renorm, attention_mask=position,
                                         attention=attention)
    assert len(zeroed) == (model.cfg.n_layers * (4 if attention == "blockwise" else 1))
    assert torch.equal(out[True, False], out[False, False])
    assert torch.equal(out[True, True], out[False, True])
    assert not torch.equal(out[True, False], out[True, True])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_uniforms_equal_the_torch_hash(dtype, monkeypatch):
    from cwlens.faithfulness import ranking

    queries = torch.tensor([0, 1, 2, 7, 300, 16383, 2**31 + 5])
    keys = torch.arange(0, 1000, 3)
    for key in ("ties:0:3", "0:gsm8k-12/0:29", ""):
        monkeypatch.setenv("CWLENS_NATIVE", "1")
        fast = ranking.uniforms_at(3, queries, keys, key, dtype)
        monkeypatch.setenv("CWLENS_NATIVE", "0")
        slow = ranking.uniforms_at(3, queries, keys, key, dtype)
        assert fast.dtype == dtype and torch.equal(fast, slow)
        assert 0 <= float(fast.min()) and float(fast.max()) < 1


def test_every_tensor_handed_to_c_is_checked():
    """A tensor of another shape than C reads (first: one per text) is refused, never read
    past its end."""
    scores, eligible, tb, first = tied_rows(0, 5, True, None, 12)
    b, h, q, w = scores.shape
    lo, hi = torch.zeros(b, 1, q, dtype=torch.int64), torch.full((b, 1, q), w)
    ks = torch.ones(1, b, 1, q, dtype=torch.int64)
    assert native.row_masks(scores, tb, lo, hi, torch.zeros(b, dtype=torch.int64), [0], ks) is not None
    for bad_first in (torch.zeros(b - 1, dtype=torch.int64), torch.zeros(b, 2, dtype=torch.int64)):
        with pytest.raises(ValueError, match="first must be a int64 CPU tensor"):
            native.row_masks(scores, tb, lo, hi, bad_first, [0], ks)
    with pytest.raises(ValueError, match="first must be"):
        native.row_masks(scores, tb, lo, hi, torch.zeros(b), [0], ks)  # float keys
    with pytest.raises(ValueError, match="hi must be"):
        native.row_masks(scores, tb, lo, hi[:, :, :-1], torch.zeros(b, dtype=torch.int64), [0], ks)
    with pytest.raises(ValueError, match="ks must be"):
        native.row_masks(scores, tb, lo, hi, torch.zeros(b, dtype=torch.int64), [0, 1], ks)
    with pytest.raises(ValueError, match="bits"):
        native.zero_masked(torch.rand(2, 3, 17), torch.zeros(2, 3, 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="bits must be"):
        native.zero_masked(torch.rand(2, 3, 16), torch.zeros(3, 2, dtype=torch.uint8))
