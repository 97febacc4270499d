"""scripts/long_context.py end to end on a tiny decoder: a text longer than the model's
context length (no silent cut at n_ctx), the tables it documents, and values that follow
from the definitions (the first query sees only the first token; every real query is
counted once per group)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from cwlens.engine.batching import token_ids
from cwlens.testing import save_tiny, tiny_model

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "long_context.py"


def load_script():
    spec = importlib.util.spec_from_file_location("long_context_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_token_ids_keep_a_text_longer_than_the_context_only_when_asked():
    model = tiny_model("llama")
    text = "the cat sat on the mat . " * 60  # > 128 = the tiny model's n_ctx
    assert len(token_ids(model, text)) == 128
    assert len(token_ids(model, text, truncate=False)) > 128


def test_long_text_is_the_shipped_documents_in_order():
    script = load_script()
    model = tiny_model("llama")
    tokens, prov = script.long_text(model, 300)
    assert tokens.shape == (1, 300) and prov["documents"]["fineweb_edu"] >= 1
    from cwlens.datasets import load_dataset

    first = token_ids(model, load_dataset("fineweb_edu", 1)[0].text, truncate=False)
    n = min(len(first), 300) - 1  # the first document's last token may merge with "\n\n"
    torch.testing.assert_close(tokens[0, :n], first[:n])


def test_the_script_writes_the_documented_tables(tmp_path):
    model_dir = save_tiny("llama", tmp_path / "model")
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", str(model_dir), "--tokens", "160", "--out", str(out),
         "--no-png", "--per-octave", "2", "--query-block", "48", "--from-position", "8"],
        capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    curves = pd.read_csv(out / "curves.csv", dtype={"keys": str, "layers": str})
    assert list(curves.columns) == ["key_set", "keys", "metric", "group", "layers", "bin_lo", "bin_hi",
                                    "position", "n_queries", "mean", "low", "high"]
    assert set(curves.key_set) == {"first_token", "first_4_tokens"}
    assert set(curves.group) == {"early", "middle"}  # 2 layers: thirds of size 1, 1, 0
    for _, part in curves.groupby(["key_set", "metric", "group"]):
        assert part.n_queries.sum() == 160
    first = curves[curves.bin_lo == 1]  # query 0 sees only key 0: all of its row
    assert (first.bin_hi == 1).all()
    assert first["mean"].to_numpy() == pytest.approx(1.0, abs=1e-5)
    four = curves[(curves.key_set == "first_4_tokens") & (curves.bin_hi <= 4)]
    assert four["mean"].to_numpy() == pytest.approx(1.0, abs=1e-5)
    att = curves[curves.metric == "attention"].pivot_table(index=["group", "bin_lo"], columns="key_set",
                                                           values="mean")
    assert (att.first_4_tokens >= att.first_token - 1e-6).all()  # attention is non-negative
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tokens"] == 160 and summary["context_length"] == 128
    pd.testing.assert_frame_equal(pd.DataFrame(summary["curves"]), curves, rtol=1e-12)
    layers = pd.read_csv(out / "per_layer.csv")
    assert set(layers.layer) == {0, 1} and set(layers.n_queries) == {160 - 7}
    assert (out / "long_context.html").exists()


def test_bad_arguments_stop_before_the_model_loads(tmp_path):
    for args, message in ((["--tokens", "0"], "--tokens"), (["--interval", "0.9", "0.1"], "--interval")):
        run = subprocess.run([sys.executable, str(SCRIPT), "--model", str(tmp_path / "nowhere"), *args],
                             capture_output=True, text=True)
        assert run.returncode == 2 and message in run.stderr


def test_blockwise_attention_gives_the_eager_curves(tmp_path):
    """``--attention blockwise`` runs (it was refused by an out-of-date signature probe) and
    gives the curves of the eager run."""
    model_dir = save_tiny("llama", tmp_path / "model")
    curves = {}
    for attention in ("eager", "blockwise"):
        out = tmp_path / attention
        run = subprocess.run(
            [sys.executable, str(SCRIPT), "--model", str(model_dir), "--tokens", "96", "--out", str(out),
             "--no-png", "--query-block", "40", "--attention", attention],
            capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-3000:]
        curves[attention] = pd.read_csv(out / "curves.csv", dtype={"keys": str, "layers": str})
    pd.testing.assert_frame_equal(curves["eager"], curves["blockwise"], rtol=0, atol=1e-6)
