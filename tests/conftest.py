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
