"""Unit tier: identities of the pure math on random tensors (no model)."""

import pytest
import torch
from torch.testing import assert_close

from cwlens.core import AttentionGeometry
from cwlens.errors import NonFiniteError, ShapeMismatchError, UnknownOptionError
from cwlens.testing import naive_measures, random_layer

SHAPES = [
    dict(n_heads=4, n_kv=2),  # GQA
    dict(n_heads=4, n_kv=4),  # MHA
    dict(n_heads=6, n_kv=1),  # MQA
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["intra", "inter"])
def test_fast_path_equals_naive_float64(shape, kind):
    pattern, v, W_O = random_layer(**shape, seed=1)
    geo = AttentionGeometry(pattern, v, W_O)
    ref = naive_measures(pattern, v, W_O)
    tol = dict(rtol=1e-4, atol=1e-5)
    assert_close(geo.contribution(kind).double(), ref[f"contribution_{kind}"], **tol)
    assert_close(geo.value_weighted().double(), ref["value_weighted"], **tol)
    assert_close(
        geo.value_weighted_output_normalized(kind).double(),
        ref[f"value_weighted_output_normalized_{kind}"],
        **tol,
    )
    assert_close(geo.relative_norm(kind).double(), ref[f"relative_norm_{kind}"], **tol)
    assert_close(geo.cosine(kind).double(), ref[f"cosine_{kind}"], **tol)


@pytest.mark.parametrize("shape", SHAPES)
def test_sums_to_one(shape):
    pattern, v, W_O = random_layer(**shape, seed=2)
    geo = AttentionGeometry(pattern, v, W_O)
    intra = geo.contribution("intra")
    inter = geo.contribution("inter")
    assert_close(intra.sum(-1), torch.ones_like(intra.sum(-1)), rtol=0, atol=1e-4)
    assert_close(inter.sum((1, 3)), torch.ones_like(inter.sum((1, 3))), rtol=0, atol=1e-4)


@pytest.mark.parametrize("kind", ["intra", "inter"])
def test_factors_multiply_to_weight(kind):
    pattern, v, W_O = random_layer(seed=3)
    geo = AttentionGeometry(pattern, v, W_O)
    product = geo.attention() * geo.relative_norm(kind) * geo.cosine(kind)
    assert_close(product, geo.contribution(kind), rtol=1e-4, atol=1e-6)


def test_contributions_can_be_negative():
    pattern, v, W_O = random_layer(seed=4)
    assert (AttentionGeometry(pattern, v, W_O).contribution("inter") < 0).any()


def test_heads_and_keys_rebuild_output():
    pattern, v, W_O = random_layer(seed=5)
    geo = AttentionGeometry(pattern, v, W_O)
    ref = naive_measures(pattern, v, W_O)
    assert_close(geo.layer_output.double(), ref["layer_output"], rtol=1e-4, atol=1e-5)
    assert_close(geo.head_outputs().sum(2), geo.layer_output, rtol=1e-5, atol=1e-5)


def test_float64_inputs_stay_float64_and_bf16_is_upcast():
    pattern, v, W_O = random_layer(seed=6, dtype=torch.float64)
    assert AttentionGeometry(pattern, v, W_O).contribution().dtype == torch.float64
    geo = AttentionGeometry(pattern.bfloat16(), v.bfloat16(), W_O.bfloat16())
    assert geo.contribution().dtype == torch.float32


def test_padding_mask_zeroes_pad_rows_and_columns_without_nan():
    pattern, v, W_O = random_layer(batch=2, pos=6, seed=7)
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, :2] = False  # left padding on the second sequence
    geo = AttentionGeometry(pattern, v, W_O, position_mask=mask)
    for kind in ("intra", "inter"):
        c = geo.contribution(kind)
        assert torch.isfinite(c).all()
        assert (c[1, :, :2, :] == 0).all() and (c[1, :, :, :2] == 0).all()
        assert geo.zero_output(kind)[1, ..., :2].all()
        assert_close(geo.cosine(kind)[1, :, :2], torch.zeros_like(geo.cosine(kind)[1, :, :2]))


def test_zero_value_head_gives_zeros_not_nan():
    pattern, v, W_O = random_layer(n_heads=4, n_kv=4, seed=8)
    v[:, :, 0] = 0
    geo = AttentionGeometry(pattern, v, W_O)
    c = geo.contribution("intra")
    assert torch.isfinite(c).all() and (c[:, 0] == 0).all()
    assert torch.isfinite(geo.cosine("intra")).all()
    assert geo.zero_output("intra")[:, 0].all()


def test_non_finite_raises():
    pattern, v, W_O = random_layer(seed=9)
    v[0, 0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="float32 or bfloat16"):
        AttentionGeometry(pattern, v, W_O, layer=3).contribution()


def test_bad_kind_and_metric():
    geo = AttentionGeometry(*random_layer())
    with pytest.raises(UnknownOptionError, match="'intra'.*'inter'"):
        geo.contribution("outer")
    with pytest.raises(UnknownOptionError, match="value_weighted_output_normalized"):
        geo.measure("saliency")


def test_shape_mismatch_message_names_shapes():
    pattern, v, W_O = random_layer(n_heads=4, n_kv=2, d_head=5)
    with pytest.raises(ShapeMismatchError, match=r"W_O is \(3, 5, 12\)"):
        AttentionGeometry(pattern, v, W_O[:3], layer=0)
    with pytest.raises(ShapeMismatchError, match="3 kv heads do not divide 4"):
        AttentionGeometry(pattern, torch.randn(2, 7, 3, 5), W_O)


def test_decomposition_table_matches_tensors():
    import cwlens
    from cwlens.testing import tiny_model

    model = tiny_model("llama")
    tokens = model.to_tokens("the cat sat on the mat")
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens)
    parts = cwlens.decompose(cache, model, 1)
    df = parts.to_dataframe(query=-1, str_tokens=model.to_str_tokens(tokens[0]))
    n = tokens.shape[1]
    assert len(df) == model.cfg.n_heads * n and set(df["layer"]) == {1}
    row = df[(df["head"] == 2) & (df["key"] == 1)].iloc[0]
    assert row.contribution == pytest.approx(float(parts.contribution[0, 2, n - 1, 1]))
    assert row.attention * row.relative_norm * row.cosine == pytest.approx(row.contribution, abs=1e-6)
    assert df.groupby("head").contribution.sum().sum() == pytest.approx(1.0, abs=1e-5)


def test_decomposition_table_of_an_encoder_lists_every_key_and_checks_its_arguments():
    """On BERT, query 0 got key 0 only (4 rows, weights summing to 0.21): the table
    assumed a decoder; query=99 wrapped round to 1; a bad batch or a short token list
    raised a bare IndexError."""
    import cwlens
    from cwlens.errors import InvalidArgumentError
    from cwlens.testing import tiny_model

    model = tiny_model("bert")
    _, cache = cwlens.run_with_cache(model, "the cat sat on the mat")
    parts = cwlens.decompose(cache, model, 0)
    n = parts.contribution.shape[-1]
    df = parts.to_dataframe(query=0)
    assert not parts.causal and len(df) == model.cfg.n_heads * n
    assert df.contribution.sum() == pytest.approx(float(parts.contribution[0, :, 0].sum()), abs=1e-5)
    assert df.contribution.sum() == pytest.approx(1.0, abs=1e-5)  # inter: heads and keys sum to 1
    for bad in ({"query": 99}, {"query": -n - 1}, {"batch": 3}, {"query": 1.0}):
        with pytest.raises(InvalidArgumentError, match="out of range"):
            parts.to_dataframe(**bad)
    with pytest.raises(ShapeMismatchError, match="str_tokens has 1 tokens"):
        parts.to_dataframe(str_tokens=["a"])


@pytest.mark.parametrize("kind", ["intra", "inter"])
def test_long_sequence_path_equals_naive(kind):
    """Sequences longer than d_model (once a separate Gram-matrix path, now the same one)."""
    pattern, v, W_O = random_layer(batch=1, n_heads=4, n_kv=2, pos=20, d_head=3, d_model=8, seed=11)
    geo = AttentionGeometry(pattern, v, W_O)
    ref = naive_measures(pattern, v, W_O)
    assert_close(geo.contribution(kind).double(), ref[f"contribution_{kind}"], rtol=1e-4, atol=1e-5)
    if kind == "inter":
        norm = geo.output_norm("inter").double().squeeze(1)
        assert_close(norm, ref["layer_output"].norm(dim=-1), rtol=1e-5, atol=1e-6)
