"""The benchmark script runs and prints what its docstring promises (no timing asserted:
speed lives in the benchmark, never in tests)."""

import json
import subprocess
import sys
from pathlib import Path

import torch

import cwlens
from cwlens.models.random_init import random_model

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "benchmark.py"


def test_stream_json_lines_have_the_documented_keys():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--stream", "--json", "--lengths", "16", "32", "--repeats", "1",
         "--random-config", "tiny-llama"], capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.strip().splitlines()]
    assert [r["n"] for r in rows] == [16, 32]
    for r in rows:
        assert {"n", "forward_s", "stream_s", "ratio", "peak_extra_mb"} <= set(r)
        assert r["ratio"] == r["stream_s"] / r["forward_s"]


def test_random_model_has_the_shape_and_exact_identities():
    model = random_model("tiny-llama", n_layers=1)
    assert model.cfg.n_layers == 1 and model.cfg.n_heads == 4
    tokens = torch.randint(3, 60, (2, 12))
    res = cwlens.stream_reduce(model, tokens, [cwlens.reducers.HeadSummary()], closure=True)
    assert res.closure.worst_relative_error < 1e-5
    share = res["heads"].output_share.sum(-1)
    torch.testing.assert_close(share, torch.ones_like(share), rtol=0, atol=1e-5)
