"""Bad input to the Python API raises a ``CwlensError`` subclass that names the problem.

One test per defect found in issue 9 (each failed before its fix).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import cwlens
from cwlens.core._types import METRICS
from cwlens.errors import (
    CwlensError,
    DeviceNotAvailableError,
    EmptyInputError,
    InvalidArgumentError,
    LayerOutOfRangeError,
    ModelNotAvailableError,
    NonFiniteError,
    ShapeMismatchError,
)
from cwlens.testing import save_tiny, tiny_model


@pytest.fixture(scope="module")
def llama():
    model = tiny_model("llama")  # 4 query heads, 2 kv heads (GQA)
    tokens = model.to_tokens("the cat sat on the mat")
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens)
    return model, tokens, cache


# -- layers -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "layer", [np.int64(1), np.int32(1), torch.tensor(1), torch.tensor(1, dtype=torch.int32)],
    ids=["np.int64", "np.int32", "torch-0d-int64", "torch-0d-int32"],
)
def test_numpy_and_torch_integer_layers_are_accepted(llama, layer):
    model, _, cache = llama
    want = cwlens.contribution_weights(cache, model, 1)
    assert torch.equal(cwlens.contribution_weights(cache, model, layer), want)  # single: no layer axis


def test_integer_arrays_of_layers_are_accepted(llama):
    model, _, cache = llama
    want = cwlens.contribution_weights(cache, model, [0, 1])
    for layers in (np.array([0, 1]), torch.tensor([0, 1]), [np.int64(0), torch.tensor(1)]):
        assert torch.equal(cwlens.contribution_weights(cache, model, layers), want)


@pytest.mark.parametrize(
    "layer", [1.0, True, np.float64(1.0), np.bool_(True), torch.tensor(1.0), torch.tensor(True),
              [0, 1.5], "1", torch.tensor([[0, 1]])],
    ids=["float", "bool", "np.float64", "np.bool_", "torch-float", "torch-bool", "list-with-float",
         "str", "2d-tensor"],
)
def test_non_integer_layers_are_refused(llama, layer):
    model, _, cache = llama
    with pytest.raises(LayerOutOfRangeError, match="Layers must be ints"):
        cwlens.contribution_weights(cache, model, layer)


# -- zero-length input --------------------------------------------------------------------
@pytest.mark.parametrize(
    "make", [lambda m: "", lambda m: "   ", lambda m: [], lambda m: torch.zeros(1, 0, dtype=torch.long),
             lambda m: torch.zeros(0, 5, dtype=torch.long)],
    ids=["empty-string", "blank-string", "empty-list", "zero-tokens", "zero-batch"],
)
def test_zero_length_input_is_refused(llama, make):
    model, _, _ = llama
    with pytest.raises(EmptyInputError, match="empty|zero|no tokens"):
        cwlens.run_with_cache(model, make(model))


def test_empty_batch_of_texts_is_refused(llama):
    from cwlens.engine.batching import pad_batch

    model, _, _ = llama
    with pytest.raises(EmptyInputError):
        pad_batch(model, [])
    with pytest.raises(EmptyInputError, match="text 1"):
        pad_batch(model, ["the cat", torch.zeros(0, dtype=torch.long)])


def test_analysing_an_empty_text_is_refused(llama):
    from cwlens.report import analyze_text

    model, _, _ = llama
    with pytest.raises(EmptyInputError):
        analyze_text(model, "")


# -- attention mask -----------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 2), (2, 7), (7,), (1, 8)])
def test_mask_of_the_wrong_shape_is_refused_before_the_forward_pass(llama, shape):
    model, tokens, _ = llama  # tokens [1, 7]
    with pytest.raises(ShapeMismatchError, match=r"attention_mask .* tokens"):
        cwlens.run_with_cache(model, tokens, attention_mask=torch.ones(shape, dtype=torch.long))


def test_mask_of_the_right_shape_still_works(llama):
    model, tokens, _ = llama
    logits, _ = cwlens.run_with_cache(model, tokens, attention_mask=torch.ones_like(tokens))
    assert logits.shape[:2] == tokens.shape


# -- non-finite caches --------------------------------------------------------------------
@pytest.mark.parametrize("hook", ["hook_pattern", "hook_v"])
@pytest.mark.parametrize("kind", ["inter", "intra"])
@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_cache_raises_for_every_metric(llama, metric, kind, hook, bad):
    model, _, cache = llama
    broken = dict(cache)
    t = cache[f"blocks.1.attn.{hook}"].clone()
    t.view(-1)[3] = bad
    broken[f"blocks.1.attn.{hook}"] = t
    with pytest.raises(NonFiniteError, match="layer 1"):
        cwlens.importance(broken, model, 1, metric=metric, kind=kind)


# -- cache vs model -----------------------------------------------------------------------
def test_mha_cache_on_a_gqa_model_is_refused(llama):
    model, _, cache = llama
    mha = dict(cache)
    mha["blocks.0.attn.hook_v"] = cache["blocks.0.attn.hook_v"].repeat_interleave(2, dim=2)
    with pytest.raises(ShapeMismatchError, match="4 value heads.*2 kv heads"):
        cwlens.contribution_weights(mha, model, 0)


def test_ungrouped_cache_is_accepted_when_the_model_ungroups(llama, monkeypatch):
    model, _, cache = llama
    mha = dict(cache)
    mha["blocks.0.attn.hook_v"] = cache["blocks.0.attn.hook_v"].repeat_interleave(2, dim=2)
    monkeypatch.setattr(model.cfg, "ungroup_grouped_query_attention", True, raising=False)
    got = cwlens.contribution_weights(mha, model, 0)
    assert torch.allclose(got, cwlens.contribution_weights(cache, model, 0), atol=1e-6)


# -- model loading ------------------------------------------------------------------------
def _corrupt_config(d):
    (d / "config.json").write_text("{ this is not json")


def _unknown_model_type(d):
    (d / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))


def _no_weights(d):
    for f in d.glob("*.safetensors"):
        f.unlink()


def _no_config(d):
    (d / "config.json").unlink()


@pytest.mark.parametrize("breakage", [_corrupt_config, _unknown_model_type, _no_weights, _no_config])
def test_broken_model_directory_raises_model_not_available(tmp_path, breakage):
    path = save_tiny("llama", tmp_path)
    breakage(path)
    with pytest.raises(ModelNotAvailableError) as err:
        cwlens.load_model(str(path), device="cpu")
    assert str(path) in str(err.value)


def test_model_path_that_is_a_file(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"\0" * 10)
    with pytest.raises(ModelNotAvailableError, match="not a directory|config.json"):
        cwlens.load_model(str(f), device="cpu")


def test_hub_id_while_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotAvailableError, match="no-such-org/no-such-model"):
        cwlens.load_model("no-such-org/no-such-model", device="cpu")


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "gpu"])
def test_unknown_device(device):
    with pytest.raises(DeviceNotAvailableError, match="device"):
        cwlens.load_model("smollm2-135m", device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_fails_before_loading(monkeypatch):
    from cwlens.engine.models import loading

    monkeypatch.setattr(loading, "resolve", lambda *a: pytest.fail("resolved the model first"))
    with pytest.raises(DeviceNotAvailableError, match="cuda.*--device cpu"):
        cwlens.load_model("smollm2-135m", device="cuda")


# -- files left behind --------------------------------------------------------------------
def test_tiny_model_leaves_no_temp_dir(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    tiny_model("gpt2")
    tiny_model("gpt2")
    assert list(tmp_path.iterdir()) == []


KILLED_CONVERSION = """
import os, signal, sys
from pathlib import Path
from cwlens.engine.models import gguf_local
from cwlens.engine.models.registry import OfflineGGUF

def convert(gguf_path, out):
    (Path(out) / "model.safetensors").write_bytes(b"x" * 1000)
    os.kill(os.getpid(), signal.SIGKILL)  # killed in the middle of the first conversion

gguf_local._convert = convert
gguf_local.find_gguf = lambda spec: Path(sys.argv[1])
gguf_local.dequantized_dir("tiny", OfflineGGUF("m", "f.gguf", "pip install m"))
"""


def test_killed_conversion_leaves_no_orphan(tmp_path, monkeypatch):
    from pathlib import Path

    from cwlens.engine.models import gguf_local
    from cwlens.engine.models.registry import OfflineGGUF

    monkeypatch.setenv("CWLENS_CACHE", str(tmp_path))
    gguf = tmp_path / "f.gguf"
    gguf.write_bytes(b"GGUF")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.run([sys.executable, "-c", KILLED_CONVERSION, str(gguf)], env=env)
    assert proc.returncode == -9
    models = tmp_path / "models"
    assert len(list(models.iterdir())) == 1  # the killed run's partial directory

    def convert(gguf_path, out):
        (Path(out) / "config.json").write_text("{}")

    monkeypatch.setattr(gguf_local, "_convert", convert)
    monkeypatch.setattr(gguf_local, "find_gguf", lambda spec: gguf)
    target = gguf_local.dequantized_dir("tiny", OfflineGGUF("m", "f.gguf", "pip install m"))
    assert sorted(p.name for p in models.iterdir()) == ["tiny"]  # the orphan was removed
    assert (target / "config.json").is_file()


def test_a_running_conversion_is_not_cleaned(tmp_path):
    from cwlens.engine.models import gguf_local

    live = gguf_local.temp_dir_for(tmp_path / "tiny")
    gguf_local.clean_stale_temp_dirs(tmp_path / "tiny")
    assert live.is_dir()  # this process is alive: its conversion is kept


# -- protocol settings --------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs", [dict(rates=(1.5,)), dict(rates=()), dict(batch_tokens=0), dict(max_tokens=0),
               dict(max_tokens=-3), dict(metrics=()), dict(layers=(-1,))],
    ids=["rate>1", "no-rates", "batch_tokens=0", "max_tokens=0", "max_tokens<0", "no-metrics",
         "negative-layer"],
)
def test_faithfulness_config_refuses_bad_values(kwargs):
    from cwlens.faithfulness import FaithfulnessConfig

    with pytest.raises(CwlensError):
        FaithfulnessConfig(**kwargs)


@pytest.mark.parametrize("kwargs, words", [
    (dict(renormalize="no"), "renormalize must be True or False"),
    (dict(mask_first_token=1), "mask_first_token must be True or False"),
    (dict(causal_only="False"), "causal_only must be True or False"),
    (dict(seed=1.5), "seed must be an integer"),
    (dict(metrics="attention"), "metrics must be a list or tuple"),
    (dict(modes="sufficiency"), "modes must be a list or tuple"),
    (dict(rates=0.5), "rates must be a list or tuple"),
    (dict(layers=2), "layers must be a list or tuple"),
])
def test_faithfulness_config_reads_no_truthy_strings(kwargs, words):
    """renormalize="no" renormalised (a non-empty string is true), seed=1.5 was kept,
    metrics="attention" was split into letters ("Unknown metric='a'"), rates=0.5 raised a
    TypeError."""
    import numpy as np

    from cwlens.faithfulness import FaithfulnessConfig

    with pytest.raises(CwlensError, match=words):
        FaithfulnessConfig(**kwargs)
    assert FaithfulnessConfig(seed=np.int64(3)).seed == 3


def test_too_many_samples_is_a_cwlens_error():
    from cwlens.datasets import load_dataset

    with pytest.raises(InvalidArgumentError, match="has only 150 rows"):
        load_dataset("fineweb_edu", n=151)
    with pytest.raises(InvalidArgumentError):
        load_dataset("gsm8k", n=-1)


def test_something_else_where_the_model_goes_is_named(llama):
    """Arguments swapped, a model name not yet loaded, None: one clear error each."""
    from cwlens.errors import InvalidArgumentError

    model, _, cache = llama
    with pytest.raises(InvalidArgumentError, match=r"got the ActivationCache \(arguments swapped\? the order is \(cache, model\)"):
        cwlens.contribution_weights(model, cache)
    with pytest.raises(InvalidArgumentError, match="expected an activation cache .* got str"):
        cwlens.contribution_weights("hello", model)
    with pytest.raises(InvalidArgumentError, match="is loaded first, model = cwlens.load_model"):
        cwlens.wrap("gpt2")
    with pytest.raises(InvalidArgumentError, match="got None"):
        cwlens.wrap(None)
    with pytest.raises(InvalidArgumentError, match="name_or_path must be a model name"):
        cwlens.load_model(5)
    with pytest.raises(InvalidArgumentError, match="dtype must be a floating torch.dtype"):
        cwlens.load_model("smollm2-135m", dtype="half-ish")
    # an integer dtype was blamed on the model folder ("not a complete Hugging Face model")
    with pytest.raises(InvalidArgumentError, match="dtype must be a floating torch.dtype"):
        cwlens.load_model("smollm2-135m", dtype=torch.int8)
    # compatibility_mode="no" folded LayerNorm (a non-empty string is true)
    with pytest.raises(InvalidArgumentError, match="compatibility_mode must be True or False"):
        cwlens.load_model("smollm2-135m", compatibility_mode="no")
    # a bare torch module (a Hugging Face model) raised AttributeError 'cfg'
    with pytest.raises(InvalidArgumentError, match=r"got a torch module without a TransformerLens cfg \(Linear\).*cwlens.load_model"):
        cwlens.wrap(torch.nn.Linear(2, 2))


def test_load_model_takes_a_dtype_by_name(tmp_path):
    model = cwlens.load_model(str(save_tiny("llama", tmp_path)), device="cpu", dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16


@pytest.mark.parametrize("layer, words", [([], "no layer given"), (range(0), "no layer given"),
                                          ([0, 0], "layer 0 listed twice"),
                                          ([1, -1], "layer 1 listed twice")])
def test_an_empty_or_repeated_layer_list_is_named(llama, layer, words):
    from cwlens.errors import LayerOutOfRangeError

    model, _, cache = llama
    with pytest.raises(LayerOutOfRangeError, match=words):
        cwlens.contribution_weights(cache, model, layer=layer)


@pytest.mark.parametrize("bad, error", [
    ("zeros", "no real token"), ("half", r"0 \(padding\) and 1"), ("nan", r"0 \(padding\) and 1"),
    ("list", "tensor of 0/1"), ("3d", "must be \\[batch, pos\\]")])
def test_measures_check_the_attention_mask_like_run_with_cache(bad, error):
    """contribution_weights / decompose / closure took an all-zero mask (all-zero
    weights, no error), 0.5, 2 or NaN entries, and a list (a raw AttributeError)."""
    from cwlens.errors import CwlensError
    from cwlens.testing import tiny_model

    model = tiny_model("llama")
    tokens = model.to_tokens("the cat sat")
    _, cache = cwlens.run_with_cache(model, tokens)
    ones = torch.ones_like(tokens)
    mask = {"zeros": torch.zeros_like(tokens), "half": ones * 0.5,
            "nan": torch.full(tokens.shape, float("nan")), "list": ones.tolist(),
            "3d": ones[None]}[bad]
    for call in (lambda: cwlens.contribution_weights(cache, model, 0, attention_mask=mask),
                 lambda: cwlens.decompose(cache, model, 0, attention_mask=mask),
                 lambda: cwlens.closure(cache, model, 0, attention_mask=mask)):
        with pytest.raises(CwlensError, match=error):
            call()
    assert cwlens.contribution_weights(cache, model, 0, attention_mask=ones).shape[-1] == tokens.shape[1]


@pytest.mark.parametrize("bad", ["long", "numpy", "list", "meta"])
def test_attention_geometry_refuses_what_is_not_a_float_tensor(bad):
    """An integer pattern was cast silently, numpy arrays / lists / meta tensors raised raw
    AttributeError / RuntimeError."""
    from cwlens.core.geometry import AttentionGeometry
    from cwlens.errors import CwlensError

    pattern = torch.full((1, 2, 3, 3), 1 / 3)
    v, W_O = torch.randn(1, 3, 2, 4), torch.randn(2, 4, 5)
    AttentionGeometry(pattern, v, W_O).contribution()  # the floats work
    wrong = {"long": pattern.long(), "numpy": pattern.numpy(), "list": pattern.tolist(),
             "meta": pattern.to("meta")}[bad]
    with pytest.raises(CwlensError, match="pattern"):
        AttentionGeometry(wrong, v, W_O)
