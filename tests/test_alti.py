"""``alti`` (Ferrando et al. 2022: residual as a part, resid_mid -- LayerNorm'd in post-LN
encoders -- as the whole) and ``alti_attention`` (the attention output as the whole)
equal their float64 definitions (:mod:`cwlens.testing`); both are metrics of the registry,
streamed and cached alike. Issue 17 renamed the earlier ``alti`` to ``alti_attention``:
the first two tests are the earlier ones, calling it by its new name."""

import pytest
import torch
from torch.testing import assert_close

from cwlens.core import AttentionGeometry
from cwlens.core.alti import AttentionOutputNorm, PostNorm, alti_attention_weights, alti_parts
from cwlens.engine.handle import wrap
from cwlens.errors import MissingHookError
from cwlens.testing import naive_alti, naive_alti_full, random_layer

SHAPES = [dict(n_heads=4, n_kv=2), dict(n_heads=4, n_kv=4), dict(n_heads=6, n_kv=1)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["intra", "inter"])
def test_alti_equals_naive_float64(shape, kind):
    pattern, v, W_O = random_layer(**shape, seed=3)
    mask = torch.ones(pattern.shape[0], pattern.shape[-1], dtype=torch.bool)
    mask[1, :2] = False  # a left-padded row
    ref = naive_alti(pattern, v, W_O, mask)[f"alti_{kind}"]
    geo = AttentionGeometry(pattern, v, W_O, position_mask=mask)
    assert_close(geo.alti_attention(kind).double(), ref, rtol=1e-4, atol=1e-5)
    assert_close(geo.measure("alti_attention", kind).double(), ref, rtol=1e-4, atol=1e-5)
    # float64 inputs: the fast path is exact to float64 rounding
    geo64 = AttentionGeometry(pattern.double(), v.double(), W_O.double(), position_mask=mask)
    assert_close(geo64.alti_attention(kind), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kind", ["intra", "inter"])
def test_alti_rows_sum_to_one_and_blocks_change_nothing(kind):
    pattern, v, W_O = random_layer(seed=4, pos=9)
    geo = AttentionGeometry(pattern.double(), v.double(), W_O.double())
    whole = geo.alti_attention(kind)
    sums = whole.sum(-1) if kind == "intra" else whole.sum((1, 3))
    # 1, or 0 where every part is farther from o than 0 is (||o - z||_1 >= ||o||_1 for all j:
    # possible in L1, e.g. two keys whose terms point apart; llm-transparency-tool's 1e-5
    # clip gives such rows uniform shares instead)
    ones = (sums - 1).abs() < 1e-12
    assert ones.float().mean() > 0.8 and (sums[~ones] == 0).all()
    assert (whole >= 0).all()
    assert (whole[..., torch.ones(9, 9).triu(1).bool()] == 0).all()  # a = 0 -> exactly 0
    # blocks of one query (the memory bound) and row blocks of the streaming engine
    assert_close(alti_attention_weights(geo, kind, max_elements=1), whole, rtol=0, atol=1e-15)
    blocks = [geo.rows(s, s + 4, key_stop=s + 4).alti_attention(kind) for s in (0, 4, 8)]
    padded = torch.zeros_like(whole)
    for s, blk in zip((0, 4, 8), blocks, strict=True):
        padded[:, :, s : s + blk.shape[2], : blk.shape[3]] = blk
    assert_close(padded, whole, rtol=0, atol=1e-15)


def _residual_layer(seed, pos=7, d_model=12, post_ln=False, dtype=torch.float64, norm_kind=None,
                    **shape):
    pattern, v, W_O = random_layer(pos=pos, d_model=d_model, seed=seed, dtype=dtype, **shape)
    g = torch.Generator().manual_seed(seed + 100)
    residual = 3 * torch.randn(pattern.shape[0], pos, d_model, generator=g, dtype=dtype)
    b_O = torch.randn(d_model, generator=g, dtype=dtype)
    norm = None
    if post_ln or norm_kind == "post_ln":
        norm = PostNorm(1 + 0.3 * torch.randn(d_model, generator=g, dtype=dtype),
                        torch.randn(d_model, generator=g, dtype=dtype), 1e-5)
    elif norm_kind == "attn_rms":  # Gemma-2/3: an RMSNorm on the attention output
        norm = AttentionOutputNorm(1 + 0.3 * torch.randn(d_model, generator=g, dtype=dtype), 1e-6)
    return pattern, v, W_O, residual, b_O, norm


def _naive_norms(norm):
    if isinstance(norm, AttentionOutputNorm):
        return dict(attn_norm=(norm.weight, norm.eps))
    return dict(norm=None if norm is None else (norm.weight, norm.bias, norm.eps))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("norm_kind", [None, "post_ln", "attn_rms"])
def test_full_alti_equals_its_definition(shape, norm_kind):
    pattern, v, W_O, residual, b_O, norm = _residual_layer(5, norm_kind=norm_kind, **shape)
    mask = torch.ones(pattern.shape[0], pattern.shape[-1], dtype=torch.bool)
    mask[1, :2] = False  # a left-padded row
    ref = naive_alti_full(pattern, v, W_O, residual, b_O, mask, **_naive_norms(norm))
    geo = AttentionGeometry(pattern, v, W_O, position_mask=mask).attach_residual(residual, b_O, norm)
    entries, resid = alti_parts(geo)
    assert_close(entries, ref[0], rtol=1e-10, atol=1e-12)
    assert_close(resid, ref[1], rtol=1e-10, atol=1e-12)
    assert_close(geo.measure("alti"), ref[0], rtol=1e-10, atol=1e-12)
    # every query's parts (heads x keys + the residual) sum to 1
    real = mask[:, -pattern.shape[2]:]
    assert_close((entries.sum((1, 3)) + resid)[real], torch.ones(int(real.sum()), dtype=torch.float64))
    # float32 inputs agree to float32 rounding; blocks of one query change nothing
    geo32 = AttentionGeometry(pattern.float(), v.float(), W_O.float(), position_mask=mask)
    geo32.attach_residual(residual.float(), b_O.float(), norm)
    assert_close(geo32.alti().double(), ref[0], rtol=1e-4, atol=1e-5)
    assert_close(alti_parts(geo, max_elements=1)[0], entries, rtol=0, atol=1e-15)
    blocks = torch.zeros_like(entries)
    for s in (0, 4):
        blk = geo.rows(s, s + 4, key_stop=s + 4).alti()
        blocks[:, :, s : s + blk.shape[2], : blk.shape[3]] = blk
    assert_close(blocks, entries, rtol=0, atol=1e-12)


def test_full_alti_differs_from_the_attention_only_variant():
    """The residual part and the residual in the whole change the ranking (the earlier
    ``alti`` had neither): this fails on the code before issue 17."""
    pattern, v, W_O, residual, b_O, _ = _residual_layer(6, pos=9)
    geo = AttentionGeometry(pattern, v, W_O).attach_residual(residual, b_O)
    full, attn = geo.measure("alti"), geo.measure("alti_attention")
    assert not torch.equal(full.argsort(-1), attn.argsort(-1))
    assert (full.sum((1, 3)) < 1 - 1e-6).any()  # the residual takes a share


def test_full_alti_without_residual_says_how_to_get_it():
    pattern, v, W_O = random_layer(seed=1)
    with pytest.raises(MissingHookError, match="hook_resid_pre.*alti_attention"):
        AttentionGeometry(pattern, v, W_O).alti()


def test_attention_output_rms_norm_parts_rebuild_resid_mid():
    """Gemma-2/3: with the RMS held at the attention output's, the parts (gamma z / rms and
    the residual) plus gamma b_O / rms sum to resid_mid = x + N(attn) exactly."""
    pattern, v, W_O, residual, b_O, norm = _residual_layer(8, norm_kind="attn_rms")
    geo = AttentionGeometry(pattern, v, W_O).attach_residual(residual, b_O, norm)
    attn = geo.layer_output + b_O
    rms = (attn.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
    z = torch.einsum("bhqk,bhkm->bhqkm", pattern, torch.einsum(
        "bkhd,hdm->bhkm", v.repeat_interleave(pattern.shape[1] // v.shape[2], dim=2), W_O))
    parts = norm.weight * z.sum((1, 3)) / rms + residual + norm.weight * b_O / rms
    mid = residual + norm.weight * attn / (attn.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
    assert_close(parts, mid, rtol=1e-12, atol=1e-12)
    entries, resid = alti_parts(geo)
    assert_close(entries.sum((1, 3)) + resid, torch.ones_like(resid))
    # the norm changes the shares: they are not the pre-LN ones
    plain = alti_parts(AttentionGeometry(pattern, v, W_O).attach_residual(residual, b_O))[0]
    assert (entries - plain).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["llama", "bert", "gemma3"])
def test_full_alti_streamed_on_a_model_equals_the_definition_on_its_hooks(arch):
    """The streamed ALTI of a tiny model equals the float64 definition on its cached
    resid_pre / pattern / v, and the definition's whole is what the model computes:
    resid_mid (pre-LN llama; Gemma-3 with its RMSNorm on the attention output) or the
    post-attention LayerNorm's output (BERT)."""
    from cwlens.engine import adapter, hook_names
    from cwlens.engine.streaming import stream_geometry
    from cwlens.testing import tiny_model

    model = tiny_model(arch, "bridge")
    tokens = torch.tensor([[2, 7, 9, 11, 13, 8, 3]] if arch == "bert" else [[1, 7, 9, 11, 13, 8]])
    ln_out = "blocks.1.ln1.hook_out"
    names = {hook_names.resid_pre(1), hook_names.pattern(1), hook_names.values(1),
             hook_names.resid_mid(1), ln_out}
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    norm = adapter.post_attention_layernorm(wrap(model), 1)
    assert (norm is not None) == (arch != "llama")
    ref, _ = naive_alti_full(cache[hook_names.pattern(1)], cache[hook_names.values(1)],
                             wrap(model).W_O(1), cache[hook_names.resid_pre(1)],
                             wrap(model).b_O(1), None, **_naive_norms(norm))
    _, (got,) = stream_geometry(model, tokens, lambda ly, geo: geo.alti(), layers=[1])
    assert_close(got.double(), ref, rtol=1e-4, atol=1e-5)
    geo = adapter.geometry(cache, wrap(model), 1)  # the cached path attaches resid_pre too
    assert_close(geo.alti().double(), ref, rtol=1e-4, atol=1e-5)
    mid = cache[hook_names.resid_pre(1)] + geo.layer_output + wrap(model).b_O(1)
    if isinstance(norm, AttentionOutputNorm):
        attn = geo.layer_output + wrap(model).b_O(1)
        mid = cache[hook_names.resid_pre(1)] + norm.weight * attn / (
            attn.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()
        assert_close(mid, cache[hook_names.resid_mid(1)], rtol=1e-4, atol=1e-5)
    elif norm is None:
        assert_close(mid, cache[hook_names.resid_mid(1)], rtol=1e-4, atol=1e-5)
    else:
        ln = torch.nn.functional.layer_norm(mid, mid.shape[-1:], norm.weight, norm.bias, norm.eps)
        assert_close(ln, cache[ln_out], rtol=1e-4, atol=1e-5)
