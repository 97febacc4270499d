"""Round 6 of bad input (issue #39, points 2-4): each test fails on the code before its fix.

Non-finite values are never hidden: every measure, reducer, stream and check raises
:class:`NonFiniteError` naming the layer (and heads) where its inputs or outputs hold NaN
or inf, and every worst-of reduction is NaN-aware.
"""

import math

import pytest
import torch

import cwlens
from cwlens import reducers
from cwlens.core import AttentionGeometry, metrics
from cwlens.engine import adapter
from cwlens.errors import NonFiniteError
from cwlens.testing import random_layer, tiny_model

TEXT = "the cat sat on the mat"
SUFFIXES = {  # (TransformerLens 4.x bridge parameter, 3.x HookedTransformer parameter)
    "W_O": ("self_attn._original_component.o_proj._original_component.weight", "attn.W_O"),
    "W_V": ("self_attn._original_component.v_proj._original_component.weight", "attn.W_V"),
    "W_out": ("mlp._original_component.down_proj._original_component.weight", "mlp.W_out"),
}


def _poison(model, layer: int, weight: str, value: float = math.nan):
    """Set one entry of ``weight`` of block ``layer`` to ``value`` (in place)."""
    bridge, hooked = SUFFIXES[weight]
    for name, p in model.named_parameters():
        if name.endswith((f"layers.{layer}._original_component.{bridge}", f"blocks.{layer}.{hooked}")):
            with torch.no_grad():
                p.view(-1)[3] = value
            return model
    raise AssertionError(f"no {weight} in layer {layer}")


@pytest.fixture(scope="module")
def broken():
    """A tiny Llama with one NaN in layer 1's W_O: its logits are NaN, layer 0 is sound."""
    return _poison(tiny_model("llama"), 1, "W_O")


@pytest.fixture(scope="module")
def broken_cache(broken):
    return cwlens.run_with_cache(broken, TEXT, closure=True, residual=True)[1]


@pytest.mark.parametrize("metric", metrics.GEOMETRY)
def test_every_measure_refuses_a_nan_weight_naming_the_layer(broken, broken_cache, metric):
    """importance(..., "value_weighted") returned NaN; alti and alti_attention returned
    finite but wrong numbers; attention passed the layer's mixing weights as sound."""
    with pytest.raises(NonFiniteError, match=r"NaN in the output projection W_O .*in layer 1, head"):
        cwlens.importance(broken_cache, broken, 1, metric)
    assert torch.isfinite(cwlens.importance(broken_cache, broken, 0, metric)).all()  # layer 0 is sound


@pytest.mark.parametrize("call", [
    lambda c, m: cwlens.contribution_weights(c, m, 1, "intra"),
    lambda c, m: cwlens.contribution_weights(c, m, None, "inter"),
    lambda c, m: cwlens.token_contributions(c, m, [0, 1]),
    lambda c, m: cwlens.decompose(c, m, 1, "intra"),
    lambda c, m: cwlens.closure(c, m),
])
def test_measure_functions_refuse_a_nan_weight(broken, broken_cache, call):
    with pytest.raises(NonFiniteError, match="layer 1"):
        call(broken_cache, broken)


def test_closure_refuses_a_nan_layer_error(broken):
    """worst_relative_error was 1.7e-07 with one layer's error NaN (Python's max drops NaN):
    the heads x keys check passed on a broken model."""
    sound = tiny_model("llama")
    _, cache = cwlens.run_with_cache(sound, TEXT, closure=True)
    name = adapter.closure_hook(sound, 1)
    cache.cache_dict[name] = cache[name].clone()
    cache.cache_dict[name][0, 2, 5] = math.inf  # the model's own output of layer 1
    with pytest.raises(NonFiniteError, match="layer 1"):
        cwlens.closure(cache, sound)
    with pytest.raises(NonFiniteError, match="layers 0, 1"):
        cwlens.Closure((0, 1), (math.nan, 1.0), (1e-7, math.inf))
    assert cwlens.Closure((0, 1), (0.0, 0.0), (1e-7, 2e-7)).worst_relative_error == 2e-7


@pytest.mark.parametrize("reducer", [
    lambda: reducers.TopK(2), lambda: reducers.TopK(2, metric="attention"),
    lambda: reducers.ColumnSums("value_weighted"), lambda: reducers.TokenLevel(),
    lambda: reducers.HeadSummary(), lambda: reducers.FullMatrices([(1, 0)]),
    lambda: reducers.KeySetWeight((0,), ("attention",)),
])
@pytest.mark.parametrize("closure", [False, True])
def test_every_reducer_refuses_a_nan_weight(broken, reducer, closure):
    """stream_reduce(..., closure=True) returned Closure(relative_error=(1.7e-07, nan))."""
    with pytest.raises(NonFiniteError, match="layer 1"):
        cwlens.stream_reduce(broken, TEXT, [reducer()], closure=closure)


def test_streams_refuse_nan_values_naming_layer_and_head():
    """NaN in one head's values (hook_v) of layer 1: stream, stream_geometry and the
    blockwise path name the layer and the head."""
    model = _poison(tiny_model("llama"), 1, "W_V")  # entry 3 of W_V: a value row of kv head 0
    with pytest.raises(NonFiniteError, match=r"layer 1, head 0\b"):
        cwlens.stream(model, TEXT, lambda layer, w: w.sum(), metric="attention")
    with pytest.raises(NonFiniteError, match="hook_v.*layer 1"):
        cwlens.stream_geometry(model, TEXT, lambda layer, geo: geo.attention().sum())
    with pytest.raises(NonFiniteError, match="layer 1"):
        cwlens.stream_reduce(model, TEXT, [reducers.HeadSummary()], attention="blockwise",
                             query_block=2)


def test_attention_gradient_refuses_nan_naming_the_layer(broken):
    from cwlens.engine.gradients import attention_gradient

    tokens = broken.to_tokens(TEXT)
    with pytest.raises(NonFiniteError, match="layer 1"):
        attention_gradient(broken, tokens)
    late = _poison(tiny_model("llama"), 1, "W_out")  # after every pattern and W_O: the loss
    with pytest.raises(NonFiniteError, match="the loss"):
        attention_gradient(late, tokens)


def test_token_flow_refuses_a_nan_residual():
    """A NaN in the last MLP made check_residual_sum's error NaN, and NaN > tolerance is
    False: the token flow was drawn for a model whose logits are NaN."""
    from cwlens import circuits

    model = _poison(tiny_model("llama"), 1, "W_out")
    cache = circuits.run_with_cache(model, TEXT)[1]
    with pytest.raises(NonFiniteError, match="layer 1.*MLP"):
        circuits.token_flow(cache, model)


def test_sink_statistics_refuse_nan(broken, broken_cache):
    from cwlens.sinks import sink_statistics

    with pytest.raises(NonFiniteError, match="layer 1"):
        sink_statistics(broken_cache, broken)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["pattern", "v", "W_O"])
def test_geometry_inputs_name_the_tensor_layer_and_head(bad, where):
    pattern, v, W_O = random_layer(n_heads=4, n_kv=2, seed=0)
    tensor = {"pattern": pattern, "v": v, "W_O": W_O}[where]
    index = {"pattern": (0, 3, 2, 1), "v": (0, 2, 1, 0), "W_O": (2, 0, 1)}[where]
    tensor[index] = bad
    head = {"pattern": 3, "v": 1, "W_O": 2}[where]
    kind = "NaN" if math.isnan(bad) else "inf"
    with pytest.raises(NonFiniteError, match=rf"{kind} in .*{where}.* in layer 7, head {head}\."):
        AttentionGeometry(pattern, v, W_O, layer=7)


def test_overflow_of_finite_inputs_is_refused_not_returned():
    """Finite values whose ||v~||^2 passes float32's range: value_weighted was inf."""
    pattern, v, W_O = random_layer(n_heads=2, n_kv=2, seed=1)
    geo = AttentionGeometry(pattern, v * 1e25, W_O, layer=3)
    assert torch.isfinite(geo.attention()).all()
    for name in ("value_weighted", "value_weighted_output_normalized", "contribution"):
        with pytest.raises(NonFiniteError, match="layer 3.*overflow"):
            geo.measure(name)
    for factor in (geo.relative_norm, geo.cosine):
        with pytest.raises(NonFiniteError, match="layer 3"):
            factor("intra")
    big = AttentionGeometry(pattern.double(), v.double() * 1e25, W_O.double())
    torch.testing.assert_close(geo.alti_attention().double(), big.alti_attention(),  # no squares: fine
                               rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(  # in float64 the same layer is fine
        big.contribution().sum((1, 3)),
        torch.ones(pattern.shape[0], pattern.shape[2], dtype=torch.float64))


def test_alti_refuses_a_nan_residual():
    pattern, v, W_O = random_layer(n_heads=2, n_kv=2, seed=2)
    geo = AttentionGeometry(pattern, v, W_O, layer=4)
    residual = torch.randn(pattern.shape[0], pattern.shape[-1], W_O.shape[-1])
    residual[0, 1, 2] = math.nan
    with pytest.raises(NonFiniteError, match="residual stream.*layer 4"):
        geo.attach_residual(residual, torch.zeros(W_O.shape[-1]))
    with pytest.raises(NonFiniteError, match="b_O.*layer 4"):
        geo.attach_residual(residual.nan_to_num(), torch.full((W_O.shape[-1],), math.inf))


def test_worst_is_nan_aware():
    from cwlens.core.numerics import worst

    assert max(1e-7, math.nan) == 1e-7  # what Python does
    assert math.isnan(worst([1e-7, math.nan])) and math.isnan(worst([math.nan, 1e-7]))
    assert worst([1e-7, 3e-7]) == 3e-7 and worst([1e-7, 3e-7], highest=False) == 1e-7
    assert math.isnan(worst([]))


def test_a_zero_output_row_is_zero_not_nan():
    """The one deliberate degenerate case: ||o|| = 0 gives weights 0 (documented), never NaN."""
    pattern, v, W_O = random_layer(n_heads=2, n_kv=2, seed=3)
    geo = AttentionGeometry(pattern, torch.zeros_like(v), W_O)
    for name in ("value_weighted_output_normalized", "contribution", "alti_attention"):
        out = geo.measure(name, "intra")
        assert torch.equal(out, torch.zeros_like(out))
    assert bool(geo.zero_output("intra").all())


def test_a_choice_log_likelihood_refuses_nan_logits():
    """NaN logits made every choice's log-likelihood NaN, and max(..., key=...) over NaN
    picked an arbitrary answer: accuracy (and lm-eval's acc) counted it."""
    from cwlens.faithfulness.choice import ChoiceRequest, continuation_logprob

    request = ChoiceRequest(item=4, choice=1, input_ids=(1, 2, 3), start=1, continuation_ids=(5, 6),
                            continuation_chars=3)
    logits = torch.randn(2, 3, 10)
    ruled_out = logits.clone()
    ruled_out[1, 1, 0] = -math.inf  # a token ruled out: still a log-likelihood
    assert math.isfinite(continuation_logprob(ruled_out, 1, 0, request))
    for bad in (math.nan, math.inf):
        broken = logits.clone()
        broken[1, 2, 7] = bad
        with pytest.raises(NonFiniteError, match="item 4, choice 1"):
            continuation_logprob(broken, 1, 0, request)
    assert math.isfinite(continuation_logprob(broken, 0, 0, request))  # the other row is fine
