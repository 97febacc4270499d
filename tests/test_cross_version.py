"""HookedTransformer (TransformerLens 3.x) and TransformerBridge (4.x) agree.

The same tiny checkpoints are loaded by both generations; 3.x runs in .venv-tl3 (a
subprocess), 4.x here. Skipped outside CI when .venv-tl3 is missing
(``bash scripts/setup.sh --tl3`` creates it).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

import cwlens
from cwlens.engine.batching import pad_batch
from cwlens.testing import ARCHITECTURES, save_tiny

ROOT = Path(__file__).resolve().parents[1]
TL3_PYTHON = ROOT / ".venv-tl3" / "bin" / "python"

sys.path.insert(0, str(Path(__file__).parent))
from tl3_dump import TEXTS  # noqa: E402


def test_hooked_transformer_and_bridge_give_the_same_weights(tmp_path):
    pytest.importorskip("transformer_lens.model_bridge", reason="needs TransformerLens 4.x here")
    if not TL3_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{TL3_PYTHON} missing: run `bash scripts/setup.sh --tl3`")
        pytest.skip("no .venv-tl3: run `bash scripts/setup.sh --tl3`")
    dirs = [str(save_tiny(arch, tmp_path)) for arch in ARCHITECTURES]
    out = tmp_path / "tl3.pt"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [str(TL3_PYTHON), str(ROOT / "tests" / "tl3_dump.py"), str(out), *dirs],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    tl3 = torch.load(out)
    for d in dirs:
        ref = tl3[d]
        assert ref["class"] in ("HookedTransformer", "HookedEncoder")
        model = cwlens.load_model(d, device="cpu", generation="bridge")
        assert type(model).__name__ == "TransformerBridge"
        tokens, mask = ref["tokens"], ref["mask"]  # the same ids (the bridge's BERT
        if "enc" not in d:  # tokenizer drops [CLS]/[SEP]; decoders must agree anyway)
            assert torch.equal(pad_batch(model, TEXTS)[0].cpu(), tokens.cpu()), d
        with torch.no_grad():
            _, cache = cwlens.run_with_cache(model, tokens, attention_mask=mask)
        for kind in ("inter", "intra"):
            got = cwlens.contribution_weights(cache, model, kind=kind, attention_mask=mask)
            assert_close(got, ref[kind], rtol=1e-4, atol=2e-5, msg=f"{d} {kind}")
        got = cwlens.importance(cache, model, metric="value_weighted", attention_mask=mask)
        assert_close(got, ref["value_weighted"], rtol=1e-4, atol=2e-5, msg=d)
        # the same model facts: a norm after attention (Gemma-3), post-norm blocks (BERT)
        assert cwlens.engine.adapter.ModelInfo.of(model).post_attn_norm == ref["post_attn_norm"], d
        assert cwlens.wrap(model).residual_problems() == ref["residual_problems"], d
