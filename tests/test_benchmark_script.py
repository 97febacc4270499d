"""The benchmark script runs and prints what its docstring promises (no timing asserted:
speed lives in the benchmark, never in tests)."""

import json
import subprocess
import sys
from pathlib import Path

import torch

import cwlens
from cwlens.engine.models.random_init import random_model

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "benchmark.py"


def test_stream_json_lines_have_the_documented_keys_and_blockwise_adds_its_own():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--stream", "--json", "--lengths", "16", "32", "--repeats", "1",
         "--random-config", "tiny-llama", "--attention", "blockwise"],
        capture_output=True, text=True, check=True).stdout
    rows = [json.loads(line) for line in out.strip().splitlines()]
    assert [r["n"] for r in rows] == [16, 32]
    for r in rows:
        assert {"n", "forward_s", "stream_s", "ratio", "peak_extra_mb"} <= set(r)
        assert r["ratio"] == r["stream_s"] / r["forward_s"]
        assert r["attention"] == "blockwise" and r["stream_peak_mb"] >= 0
        assert r["ratio_blockwise"] == r["stream_s"] / r["forward_blockwise_s"]
        assert r["ratio_alpha"] == r["stream_s"] / r["forward_alpha_s"]  # the floor reading alpha
        assert abs(r["peak_extra_mb"] - (r["stream_peak_mb"] - r["forward_peak_mb"])) < 0.2


def test_random_model_has_the_shape_and_exact_identities():
    model = random_model("tiny-llama", n_layers=1)
    assert model.cfg.n_layers == 1 and model.cfg.n_heads == 4
    tokens = torch.randint(3, 60, (2, 12))
    res = cwlens.stream_reduce(model, tokens, [cwlens.reducers.HeadSummary()], closure=True)
    assert res.closure.worst_relative_error < 1e-5
    share = res["heads"].output_share.sum(-1)
    torch.testing.assert_close(share, torch.ones_like(share), rtol=0, atol=1e-5)


def test_faithfulness_benchmark_nproc_prints_the_speed_up(tmp_path):
    """``--nproc 2``: one process and a torchrun job of two on the same sweep, in one
    invocation; it prints both runs and the speed-up, and the files are identical."""
    from cwlens.testing import save_tiny

    model = save_tiny("llama", tmp_path)
    script = Path(__file__).resolve().parents[1] / "scripts" / "benchmark_faithfulness.py"
    out = subprocess.run(
        [sys.executable, str(script), "--nproc", "2", "--model", str(model), "--samples", "4",
         "--max-tokens", "8", "--batch-tokens", "8", "--rates", "0.3", "--repeats", "1"],
        capture_output=True, text=True, check=True).stdout
    runs = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    assert [r["nproc"] for r in runs] == [1, 2] and all(r["threads_per_process"] == 1 for r in runs)
    assert runs[0]["n_batches"] == runs[1]["n_batches"] == 4
    assert "speed-up over one process: sweep " in out and "cores busy on average" in out
    assert "identical result files (every run): True" in out


def test_docs_flag_writes_the_table_into_a_docs_page_not_the_readme(tmp_path):
    """``--docs PAGE`` rewrites only the block between the page's markers and names the
    command in it; ``--readme`` is gone (no tool writes into the README)."""
    page = tmp_path / "benchmarks.md"
    page.write_text("# Benchmarks\n\n<!-- stream-benchmark:start -->\nold\n<!-- stream-benchmark:end -->\n"
                    "after\n", encoding="utf-8")
    args = [sys.executable, str(SCRIPT), "--stream", "--lengths", "16", "--repeats", "1",
            "--random-config", "tiny-llama"]
    subprocess.run(args + ["--docs", str(page)], capture_output=True, text=True, check=True)
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# Benchmarks\n\n<!-- stream-benchmark:start -->\nMeasured with `python "
                           "scripts/benchmark.py --stream --json --repeats 1 --random-config tiny-llama "
                           f"--lengths 16 --docs {page}` (tiny-llama (random weights), cpu, float32, ")
    assert "| 16 |" in text and "old" not in text and text.endswith("<!-- stream-benchmark:end -->\nafter\n")
    old = subprocess.run(args + ["--readme", str(page)], capture_output=True, text=True)
    assert old.returncode == 2 and "unrecognized arguments: --readme" in old.stderr


def test_stream_row_without_the_eager_forward_reports_null_eager_fields():
    """Where the eager forward cannot fit (its memory row failed under the cap), the timing
    row leaves it out: its time and ratio are null, the blockwise ones are still there."""
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--stream-row", "16", "--no-eager", "--repeats", "1",
         "--random-config", "tiny-llama", "--attention", "blockwise"],
        capture_output=True, text=True, check=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    assert r["forward_s"] is None and r["ratio"] is None
    assert r["ratio_blockwise"] == r["stream_s"] / r["forward_blockwise_s"]


def test_a_forward_over_the_memory_cap_fails_instead_of_waking_the_oom_killer():
    """--memory-limit-gb caps each row's address space: a row that needs more fails."""
    code = ("import sys, runpy; sys.argv = ['benchmark.py', '--memory-limit-gb', '0.001']; "
            f"ns = runpy.run_path({str(SCRIPT)!r}); import argparse; "
            "cap = ns['_memory_cap'](argparse.Namespace(device='cpu', memory_limit_gb=0.5)); "
            "cap(); x = bytearray(2**30)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and "MemoryError" in out.stderr


def test_the_memory_baseline_holds_the_weights_and_not_the_loading_peak(tmp_path):
    """CPU peaks are measured above ``loaded_baseline_mb``: the weights resident (a model
    loaded from safetensors maps them lazily, and the first forward would count them), and
    the peak reset, so that a transient of the loading is not the baseline."""
    import importlib.util
    import os

    from safetensors.torch import load_file, save_file

    if not os.path.exists("/proc/self/clear_refs"):
        import pytest

        pytest.skip("the peak reset needs Linux's /proc/self/clear_refs")
    spec = importlib.util.spec_from_file_location("benchmark_script", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def rss_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    save_file({"w": torch.ones(64, 2**20)}, tmp_path / "w.safetensors")  # 256 MB
    weights = load_file(tmp_path / "w.safetensors")  # mapped, not read

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(weights["w"], requires_grad=False)

    model = Model()
    spike = torch.ones(2**27)  # a 512 MB transient, as a GGUF dequantisation makes
    del spike
    before = rss_mb()
    base = bench.loaded_baseline_mb(model)
    after = rss_mb()
    assert base < bench.peak_rss_mb() + 1 and base < after + 32  # the spike is not the baseline
    assert after - before > 200  # the mapped weights were paged in


def test_allocators_prints_one_row_per_setting():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--allocators", "--lengths", "16", "--random-config", "tiny-llama"],
        capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("16 ")]
    assert [r[1] for r in rows] == ["default", "MALLOC_MMAP_THRESHOLD_=65536",
                                    "GLIBC_TUNABLES=glibc.malloc.hugetlb=1", "THP_MEM_ALLOC_ENABLE=1"]
    for r in rows:
        peak, user, sys_, wall = map(float, r[2:])
        assert peak >= 0 and user >= 0 and sys_ >= 0 and wall >= 0  # printed to 0.1 s


def test_sdpa_blocks_prints_the_two_block_sizes_per_length():
    out = subprocess.run([sys.executable, str(SCRIPT), "--sdpa-blocks", "--lengths", "64", "--repeats", "1"],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("64 ")]
    assert [r[1] for r in rows] == ["1", "3"]  # batch 1, and a lockstep pass of 3 copies
    for r in rows:
        assert r[2] == r[4] == "256" and float(r[6]) > 0  # short rows: one 256-row block each


def test_bad_lengths_and_two_modes_are_refused_by_name():
    for args, message in ((["--allocators", "--lengths", "-4"], "'-4' is not a positive whole number"),
                          (["--stream", "--allocators"], "not allowed with argument")):
        out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_the_alpha_floor_materialises_every_layers_weights_block_by_block():
    """``alpha_forward`` (``forward_alpha_s``): each layer's softmax(QK^T) is computed in
    query blocks (hook_pattern sees probabilities: rows sum to 1) and dropped; the pass stops
    after the last layer, like the streamed one."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark_script_alpha", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model = random_model("tiny-llama")
    tokens = torch.randint(3, 60, (1, 20))
    seen = []

    def record(tensor, hook):
        seen.append((hook.name, tensor.shape[-2], tensor.shape[-1]))
        torch.testing.assert_close(tensor.sum(-1), torch.ones(tensor.shape[:-1]))
        return None

    record.cwlens_blockwise = True
    bench._drop_pattern = record
    assert bench.alpha_forward(model, tokens, query_block=8) is None  # no logits
    n_layers = model.cfg.n_layers
    assert [name for name, _, _ in seen] == [f"blocks.{ly}.attn.hook_pattern"
                                             for ly in range(n_layers) for _ in range(3)]
    assert [(rows, keys) for _, rows, keys in seen[:3]] == [(4, 20), (8, 16), (8, 8)]
