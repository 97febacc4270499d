"""Round 6 of bad input (issue #39, points 2-4): each test fails on the code before its fix.

Non-finite values are never hidden: every measure, reducer, stream and check raises
:class:`NonFiniteError` naming the layer (and heads) where its inputs or outputs hold NaN
or inf, and every worst-of reduction is NaN-aware.
"""

import math
from types import SimpleNamespace

import pytest
import torch

import cwlens
from cwlens import reducers
from cwlens.core import AttentionGeometry, metrics
from cwlens.engine import adapter
from cwlens.engine.handle import wrap
from cwlens.errors import NonFiniteError
from cwlens.testing import random_layer, tiny_hf_model, tiny_model

TEXT = "the cat sat on the mat"
SUFFIXES = {  # (TransformerLens 4.x bridge parameter, 3.x HookedTransformer parameter)
    "W_O": ("self_attn._original_component.o_proj._original_component.weight", "attn.W_O"),
    "W_V": ("self_attn._original_component.v_proj._original_component.weight", "attn._W_V"),  # (3.x GQA)
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
    name = adapter.closure_hook(wrap(sound), 1)
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
    if wrap(model).supports_blockwise:  # (TransformerLens 4.x)
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


# -- #39.3: things that are not models are refused up front ---------------------------------


@pytest.fixture(scope="module")
def sound():
    model = tiny_model("llama")
    return model, cwlens.run_with_cache(model, TEXT, closure=True, residual=True)[1]


NOT_MODELS = {  # what a user passes by mistake -> words of the refusal
    "object": (lambda m: object(), "got object, which has no cfg"),
    "tokenizer": (lambda m: m.tokenizer, "tokenizer .*not model.tokenizer"),
    "tl config": (lambda m: m.cfg, "configuration .*not a model"),
    "hf config": (lambda m: tiny_hf_model("llama")[0].config, "configuration .*load_model"),
    "hf module": (lambda m: tiny_hf_model("llama")[0], "torch module without a TransformerLens cfg"),
    "name": (lambda m: "smollm2-135m", "'smollm2-135m'.*cwlens.load_model"),
    "cfg without shape": (lambda m: _Stub(cfg=SimpleNamespace(n_layers=2)), "no positive integer n_heads, d_model, d_head"),
    "no hooks API": (lambda m: _Stub(cfg=m.cfg), "lacks TransformerLens' hooks API .*run_with_hooks, hooks"),
}


class _Stub:
    def __init__(self, **attrs):
        vars(self).update(attrs)


def _entry_points():
    from cwlens import circuits, report, sinks
    from cwlens.datasets.records import ChoiceItem
    from cwlens.engine.gradients import attention_gradient
    from cwlens.engine.interventions import run_masked
    from cwlens.faithfulness import run_faithfulness
    from cwlens.faithfulness.accuracy import clean_accuracy
    from cwlens.report.export import export_texts
    from cwlens.sinks.token_classes import class_shares

    tokens = torch.tensor([[1, 5, 7, 9]])
    item = ChoiceItem("x-0", ("the cat", "the cat"), (" sat", " ran"), 0, "x")
    return {
        "wrap": lambda m, c: cwlens.wrap(m),
        "contribution_weights": lambda m, c: cwlens.contribution_weights(c, m, 0),
        "token_contributions": lambda m, c: cwlens.token_contributions(c, m, 0),
        "importance": lambda m, c: cwlens.importance(c, m, 0, "attention"),
        "decompose": lambda m, c: cwlens.decompose(c, m, 0),
        "closure": lambda m, c: cwlens.closure(c, m),
        "names_filter": lambda m, c: cwlens.names_filter(m),
        "run_with_cache": lambda m, c: cwlens.run_with_cache(m, TEXT),
        "stream": lambda m, c: cwlens.stream(m, TEXT, lambda layer, w: None),
        "stream_geometry": lambda m, c: cwlens.stream_geometry(m, TEXT, lambda layer, g: None),
        "stream_reduce": lambda m, c: cwlens.stream_reduce(m, TEXT, [reducers.HeadSummary()]),
        "head_scores": lambda m, c: circuits.head_scores(c, m, [2]),
        "direct_logit_attribution": lambda m, c: circuits.direct_logit_attribution(
            c, m, torch.zeros(1, 7, 10), [2], torch.tensor([1])),
        "patch_heads": lambda m, c: circuits.patch_heads(m, tokens, lambda logits: logits.sum()),
        "build_task": lambda m, c: circuits.build_task("ioi", m),
        "token_flow": lambda m, c: circuits.token_flow(c, m),
        "circuits.run_with_cache": lambda m, c: circuits.run_with_cache(m, tokens),
        "sink_statistics": lambda m, c: sinks.sink_statistics(c, m),
        "alignment_statistics": lambda m, c: sinks.alignment_statistics(c, m),
        "cosine_histograms": lambda m, c: sinks.cosine_histograms(c, m),
        "sweep_statistics": lambda m, c: sinks.sweep_statistics(c, m),
        "sink_norm_intervention": lambda m, c: sinks.sink_norm_intervention(m, tokens),
        "class_shares": lambda m, c: class_shares(m, [TEXT]),
        "attention_gradient": lambda m, c: attention_gradient(m, tokens),
        "run_masked": lambda m, c: run_masked(m, tokens, {}),
        "run_faithfulness": lambda m, c: run_faithfulness(m, "gsm8k"),
        "clean_accuracy": lambda m, c: clean_accuracy(m, [item]),
        "analyze_text": lambda m, c: report.analyze_text(m, TEXT),
        "export_texts": lambda m, c: export_texts(m, [TEXT], "/nonexistent-cwlens-out"),
    }


@pytest.mark.parametrize("what", NOT_MODELS)
def test_every_entry_point_refuses_what_is_not_a_model(sound, what):
    """cwlens.wrap(object()) returned a handle; stream(model.tokenizer, ...) and
    stream_reduce(AutoConfig..., ...) ended in a raw AttributeError."""
    from cwlens.errors import InvalidArgumentError

    model, cache = sound
    make, words = NOT_MODELS[what]
    bad = make(model)
    failures = {}
    for name, call in _entry_points().items():
        try:
            call(bad, cache)
            failures[name] = "accepted"
        except InvalidArgumentError as err:
            if "expected a TransformerLens model" not in str(err) or not __import__("re").search(words, str(err)):
                failures[name] = str(err)[:200]
        except Exception as err:  # noqa: BLE001 (what the test is about)
            failures[name] = f"{type(err).__name__}: {str(err)[:200]}"
    assert not failures, failures


def test_a_model_is_judged_by_what_it_has(sound):
    """Not by its class: a cfg with the four shape numbers and the hooks API (what a
    tracr-compiled HookedRootModule has) is a model; the handle is made once."""
    model, _ = sound
    cfg = SimpleNamespace(n_layers=2, n_heads=4, d_model=8, d_head=2)
    own = _Stub(cfg=cfg, run_with_hooks=model.run_with_hooks, hooks=model.hooks)
    handle = cwlens.wrap(own)
    assert (handle.n_layers, handle.n_heads) == (2, 4) and cwlens.wrap(own) is handle
    assert cwlens.wrap(handle) is handle and cwlens.wrap(model).model is model
    from cwlens.errors import InvalidArgumentError

    for bad_cfg in (dict(n_layers=0), dict(n_heads=True), dict(d_model=8.0), dict(d_head="2")):
        with pytest.raises(InvalidArgumentError, match="no positive integer"):
            cwlens.wrap(_Stub(cfg=SimpleNamespace(**{**vars(cfg), **bad_cfg}), run_with_hooks=print, hooks=print))


@pytest.mark.parametrize("arguments, words", [
    (dict(n_devices="2"), r"n_devices must be a whole number .*got str '2': pass n_devices=2"),
    (dict(n_devices=1.5), "n_devices must be a whole number .*float 1.5"),
    (dict(n_devices=True), "n_devices must be a whole number .*bool True"),
    (dict(device_map=5), "device_map must be one of 'auto'.*got int 5"),
    (dict(device_map=["auto"]), "device_map must be one of .*got list"),
    (dict(device_map="fastest"), "device_map='fastest' is not a strategy"),
    (dict(device_map={}), "non-empty dict"),
    (dict(max_memory={0: "1GiB"}), "max_memory is the per-device budget of a device map"),
    (dict(device_map="auto", max_memory=3), "max_memory must be a non-empty dict .*got int 3"),
    (dict(device_map="auto", max_memory={"gpu0": 10}), "max_memory key 'gpu0' is not a device"),
    (dict(device_map="auto", max_memory={"cpu": "lots"}), r"max_memory\['cpu'\] = 'lots' is not a memory size"),
    (dict(device_map="auto", max_memory={"cpu": -1}), "is not a memory size"),
    (dict(device_map="auto", max_memory={7: "1GiB"}), "budgets GPU 7, but this machine has"),
    (dict(dtype="float17"), "dtype must be a floating torch.dtype.*'float17'"),
    (dict(dtype=torch.int8), "dtype must be a floating"),
    (dict(compatibility_mode="no"), "compatibility_mode must be True or False"),
    (dict(generation=4), "generation must be 'auto', 'bridge' or 'hooked'; got 4"),
    (dict(device=True), "Unknown device True"),
    (dict(device=["cpu"]), r"Unknown device \['cpu'\]"),
])
def test_load_model_refuses_each_argument_of_the_wrong_type(arguments, words, monkeypatch):
    """n_devices="2" gave TypeError: '>' not supported between 'str' and 'int'; a
    device_map of the wrong type blamed the model's files; max_memory=5 was ignored."""
    from cwlens.engine.models import loading
    from cwlens.errors import InvalidArgumentError, UnknownOptionError

    monkeypatch.setattr(loading, "_load", lambda *a: pytest.fail("it went on to load the model"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises((InvalidArgumentError, UnknownOptionError), match=words):
        cwlens.load_model("smollm2-135m", **arguments)
