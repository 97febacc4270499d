"""Issue 19: the newer surfaces refuse bad input before any model work, with a
``CwlensError`` subclass naming the value and the fix (API), or one line and exit 1 / 2
(command line, including the torchrun environment). Each case failed before the fix
(a bare IndexError / TypeError / ZeroDivisionError, the base class where a subclass is
documented, a traceback, or silent acceptance).
"""

import io
import os
import socket
import subprocess
import sys
import warnings

import pytest
import torch

import cwlens
from cwlens import reducers
from cwlens.cli.main import main
from cwlens.errors import (
    CwlensError,
    CwlensWarning,
    EmptyInputError,
    InputTooLongError,
    InvalidArgumentError,
    LayerOutOfRangeError,
    OutputPathError,
    ShapeMismatchError,
    UnknownOptionError,
)
from cwlens.testing import save_tiny
from tests._typecheck import unchecked

LONG = " ".join(["the cat sat on the mat"] * 40)  # 241 tokens: the tiny models' n_ctx is 128


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    base = tmp_path_factory.mktemp("round2")
    path = save_tiny("llama", base)  # base / "tiny-lm": 2 layers x 4 heads, n_ctx 128
    model = cwlens.load_model(str(path), device="cpu")
    tokens = model.to_tokens("the cat sat on the mat")
    (base / "a_file").write_text("x")
    (base / "empty").mkdir()
    # learned absolute positions (GPT-2): nothing exists past n_ctx 128, so the API refuses
    learned = cwlens.load_model(str(save_tiny("gpt2", base)), device="cpu")
    return {"model": model, "tokens": tokens, "base": base, "path": path, "learned": learned}


def raw(fn):
    """``fn`` without the run-time type checker the test suite wraps around every cwlens
    function (tests/_typecheck.py): these tests check what a user gets, which is cwlens'
    own validation, not beartype's."""
    return unchecked(fn)


def make(cls, *args, **kwargs):
    """``cls(*args, **kwargs)`` with ``__init__`` unchecked (see :func:`raw`)."""
    obj = cls.__new__(cls)
    raw(cls.__init__)(obj, *args, **kwargs)
    return obj


def _fn(layer, w):
    return None


def _export(ctx, **kw):
    from cwlens.report.export import export_texts

    export_texts = raw(export_texts)
    args = {"texts": ["the cat sat"], "out_dir": ctx["base"] / "export", "fmt": "csv", **kw}
    return export_texts(ctx["model"], **args)


def _task(ctx, name, **kw):
    from cwlens.circuits import build_task

    return raw(build_task)(name, ctx["model"], **kw)


def _long_tokens(ctx):
    return torch.ones(1, 129, dtype=torch.long) * int(ctx["tokens"][0, 1])


def _long_learned(ctx):
    """129 tokens for the learned-position model (whose context is 128)."""
    return torch.full((1, 129), int(ctx["learned"].to_tokens("the")[0, -1]), dtype=torch.long)


# (call, expected error class, words the message must contain)
API = {
    # -- the stream functions: the input ---------------------------------------------
    "stream-empty-text": (lambda c: raw(cwlens.stream)(c["model"], "", _fn), EmptyInputError, "empty"),
    "stream-blank-text": (lambda c: raw(cwlens.stream)(c["model"], "   ", _fn), EmptyInputError, "empty"),
    "stream-blank-in-list": (lambda c: raw(cwlens.stream)(c["model"], ["the cat", " "], _fn), EmptyInputError, "Text 1"),
    "stream-empty-list": (lambda c: raw(cwlens.stream)(c["model"], [], _fn), EmptyInputError, "empty list"),
    "stream-id-past-vocab": (lambda c: raw(cwlens.stream)(c["model"], torch.tensor([[1, 10_000]]), _fn),
                             InvalidArgumentError, "Token id 10000"),
    "stream-negative-id": (lambda c: raw(cwlens.stream)(c["model"], torch.tensor([[1, -3]]), _fn),
                           InvalidArgumentError, "Token id -3"),
    "stream-float16-tokens": (lambda c: raw(cwlens.stream)(c["model"], c["tokens"].half(), _fn),
                              InvalidArgumentError, "torch.float16"),
    "stream-bool-tokens": (lambda c: raw(cwlens.stream)(c["model"], c["tokens"] > 0, _fn),
                           InvalidArgumentError, "integer tensor"),
    "stream-3d-tokens": (lambda c: raw(cwlens.stream)(c["model"], c["tokens"][None], _fn),
                         ShapeMismatchError, "[batch, pos]"),
    "stream-input-none": (lambda c: raw(cwlens.stream)(c["model"], None, _fn), InvalidArgumentError, "NoneType"),
    "stream-input-int": (lambda c: raw(cwlens.stream)(c["model"], 5, _fn), InvalidArgumentError, "got int"),
    "stream-fn-not-callable": (lambda c: raw(cwlens.stream)(c["model"], c["tokens"], "sum"),
                               InvalidArgumentError, "fn must be a function"),
    # past n_ctx: refused where positions are learned (rotary models run: see below)
    "stream-longer-than-context": (lambda c: raw(cwlens.stream)(c["learned"], _long_learned(c), _fn),
                                   InputTooLongError, "129 tokens"),
    "stream-geometry-long-text": (lambda c: raw(cwlens.stream_geometry)(c["learned"], LONG, _fn),
                                  InputTooLongError, "context of 128"),
    "run-with-cache-long": (lambda c: raw(cwlens.run_with_cache)(c["learned"], _long_learned(c)),
                            InputTooLongError, "n_ctx"),
    "stream-mask-values": (lambda c: raw(cwlens.stream)(c["model"], c["tokens"], _fn,
                                                   attention_mask=torch.full_like(c["tokens"], 2)),
                           InvalidArgumentError, "0 (padding) and 1"),
    "stream-mask-all-zero-row": (lambda c: raw(cwlens.stream)(c["model"], c["tokens"], _fn,
                                                         attention_mask=torch.zeros_like(c["tokens"])),
                                 EmptyInputError, "no real token"),
    "stream-geometry-closure-str": (lambda c: raw(cwlens.stream_geometry)(c["model"], c["tokens"], _fn,
                                                                     closure="yes"),
                                    InvalidArgumentError, "closure must be True or False"),
    # -- stream_reduce: the reducers ---------------------------------------------------
    "reduce-reducers-str": (lambda c: raw(cwlens.stream_reduce)(c["model"], c["tokens"], "TopK"),
                            InvalidArgumentError, "reducers must be a list"),
    "reduce-int-in-list": (lambda c: raw(cwlens.stream_reduce)(c["model"], c["tokens"], [reducers.HeadSummary(), 3]),
                           InvalidArgumentError, "3 is not a reducer"),
    "reduce-dict-value-not-reducer": (lambda c: raw(cwlens.stream_reduce)(c["model"], c["tokens"], {"a": "TopK"}),
                                      InvalidArgumentError, "is not a reducer"),
    "reduce-same-name-twice": (lambda c: raw(cwlens.stream_reduce)(
        c["model"], c["tokens"], [reducers.TopK(2, name="x"), reducers.ColumnSums(name="x")]),
        InvalidArgumentError, "two reducers are named 'x'"),
    "reduce-same-default-name": (lambda c: raw(cwlens.stream_reduce)(
        c["model"], c["tokens"], [reducers.TopK(2), reducers.TopK(2, by_abs=True)]),
        InvalidArgumentError, "top2_contribution"),
    "reduce-empty-list": (lambda c: raw(cwlens.stream_reduce)(c["model"], c["tokens"], []),
                          EmptyInputError, "at least one reducer"),
    "reduce-non-string-key": (lambda c: raw(cwlens.stream_reduce)(c["model"], c["tokens"], {1: reducers.HeadSummary()}),
                              InvalidArgumentError, "non-empty string"),
    "reduce-query-block-bool": (lambda c: raw(cwlens.stream_reduce)(c["model"], c["tokens"], [reducers.HeadSummary()],
                                                               query_block=True),
                                InvalidArgumentError, "query_block"),
    "reduce-query-block-float": (lambda c: raw(cwlens.stream_reduce)(c["model"], c["tokens"], [reducers.HeadSummary()],
                                                                query_block=2.5),
                                 InvalidArgumentError, "query_block"),
    "reduce-closure-int": (lambda c: raw(cwlens.stream_reduce)(c["model"], c["tokens"], [reducers.HeadSummary()],
                                                          closure=1),
                           InvalidArgumentError, "closure"),
    # -- reducer constructors ------------------------------------------------------------
    "topk-k-zero": (lambda c: make(reducers.TopK, k=0), InvalidArgumentError, "k must be a positive integer"),
    "topk-k-float": (lambda c: make(reducers.TopK, k=2.0), InvalidArgumentError, "got 2.0"),
    "topk-unknown-metric": (lambda c: make(reducers.TopK, metric="saliency"), UnknownOptionError, "saliency"),
    "topk-by-abs-str": (lambda c: make(reducers.TopK, by_abs="yes"), InvalidArgumentError, "by_abs"),
    "topk-empty-name": (lambda c: make(reducers.TopK, name=""), InvalidArgumentError, "name"),
    "colsums-unknown-metric": (lambda c: make(reducers.ColumnSums, "nope"), UnknownOptionError, "nope"),
    "colsums-sum-heads-none": (lambda c: make(reducers.ColumnSums, sum_heads=None), InvalidArgumentError, "sum_heads"),
    "token-level-float-layer": (lambda c: make(reducers.TokenLevel, [0, 1.5]), InvalidArgumentError, "1.5"),
    "token-level-str-layers": (lambda c: make(reducers.TokenLevel, "0"), InvalidArgumentError, "list of integers"),
    "token-level-empty": (lambda c: make(reducers.TokenLevel, []), EmptyInputError, "None for all"),
    "token-level-twice": (lambda c: make(reducers.TokenLevel, [0, 0]), InvalidArgumentError, "twice"),
    "token-level-metric-int": (lambda c: make(reducers.TokenLevel, metric=3), InvalidArgumentError, "metric"),
    "head-summary-name-none": (lambda c: make(reducers.HeadSummary, name=None), InvalidArgumentError, "name"),
    "full-pair-of-one": (lambda c: make(reducers.FullMatrices, [(0,)]), InvalidArgumentError, "(layer, head) pair"),
    "full-pair-of-three": (lambda c: make(reducers.FullMatrices, [(0, 1, 2)]), InvalidArgumentError, "(0, 1, 2)"),
    "full-no-pairs": (lambda c: make(reducers.FullMatrices, []), InvalidArgumentError, "pairs is empty"),
    "full-no-metrics": (lambda c: make(reducers.FullMatrices, [(0, 1)], metrics=[]), InvalidArgumentError, "metrics"),
    "full-metrics-a-string": (lambda c: make(reducers.FullMatrices, [(0, 1)], metrics="attention"),
                              InvalidArgumentError, "list of metric names"),
    "full-float-layer": (lambda c: make(reducers.FullMatrices, [(0.5, 1)]), InvalidArgumentError, "0.5"),
    "full-pair-twice": (lambda c: make(reducers.FullMatrices, [(0, 1), (0, 1)]), InvalidArgumentError, "twice"),
    "full-unknown-metric": (lambda c: make(reducers.FullMatrices, [(0, 1)], metrics=["att"]), UnknownOptionError, "att"),
    # -- reducers against the model, before the forward pass ------------------------------
    "token-level-partly-out-of-range": (lambda c: raw(cwlens.stream_reduce)(c["model"], c["tokens"],
                                                                       [reducers.TokenLevel([0, 5])]),
                                        LayerOutOfRangeError, "layer 5 is out of range"),
    "token-level-not-streamed": (lambda c: raw(cwlens.stream_reduce)(c["model"], c["tokens"], [reducers.TokenLevel([1])],
                                                                layers=[0]),
                                 LayerOutOfRangeError, "would not be streamed"),
    "full-head-out-of-range": (lambda c: raw(cwlens.stream_reduce)(c["model"], c["tokens"], [reducers.FullMatrices([(0, 9)])]),
                               LayerOutOfRangeError, "head 9"),
    "full-layer-out-of-range": (lambda c: raw(cwlens.stream_reduce)(c["model"], c["tokens"], [reducers.FullMatrices([(7, 0)])]),
                                LayerOutOfRangeError, "layer of the pair 7"),
    "full-layer-not-streamed": (lambda c: raw(cwlens.stream_reduce)(c["model"], c["tokens"], [reducers.FullMatrices([(1, 0)])],
                                                               layers=[0]),
                                LayerOutOfRangeError, "would not be streamed"),
    # -- export ---------------------------------------------------------------------------
    "export-bare-string": (lambda c: _export(c, texts="the cat"), InvalidArgumentError, "pass [text]"),
    "export-no-texts": (lambda c: _export(c, texts=[]), EmptyInputError, "at least one text"),
    "export-blank-text": (lambda c: _export(c, texts=["the cat", "  "]), EmptyInputError, "text 1"),
    "export-ids-wrong-length": (lambda c: _export(c, texts=["the cat", "a dog"], text_ids=["a"]),
                                ShapeMismatchError, "1 ids for 2 texts"),
    "export-ids-twice": (lambda c: _export(c, texts=["the cat", "a dog"], text_ids=["a", "a"]),
                         InvalidArgumentError, "twice"),
    "export-negative-max-tokens": (lambda c: _export(c, max_tokens=-1), InvalidArgumentError, "max_tokens"),
    "export-token-layer-out-of-range": (lambda c: _export(c, token_layers=[5]), LayerOutOfRangeError, "[5]"),
    "export-no-metrics": (lambda c: _export(c, metrics=[]), InvalidArgumentError, "non-empty list"),
    "export-metric-twice": (lambda c: _export(c, metrics=("contribution", "contribution")),
                            InvalidArgumentError, "twice"),
    "export-k-zero": (lambda c: _export(c, k=0), InvalidArgumentError, "k must be a positive integer"),
    "export-unknown-format": (lambda c: _export(c, fmt="xlsx"), UnknownOptionError, "xlsx"),
    "export-out-is-a-file": (lambda c: _export(c, out_dir=c["base"] / "a_file"), OutputPathError, "is a file"),
    "tables-wrong-token-count": (lambda c: __import__("cwlens.report.export").report.export.reduction_tables(
        raw(cwlens.stream_reduce)(c["model"], c["tokens"], [reducers.ColumnSums()]), ["a", "b"]),
        ShapeMismatchError, "str_tokens has 2"),
    "read-tables-empty-folder": (lambda c: __import__("cwlens.report.export").report.export.read_tables(c["base"] / "empty"),
                                 InvalidArgumentError, "no exported tables"),
    "circuitsvis-4d": (lambda c: __import__("cwlens.report.export").report.export.circuitsvis_heads(
        torch.ones(1, 2, 3, 3), ["a", "b", "c"]), ShapeMismatchError, "[head, query, key]"),
    # -- circuits ----------------------------------------------------------------------------
    "ioi-zero-prompts": (lambda c: _task(c, "ioi", n_prompts=0), InvalidArgumentError, "n_prompts"),
    "ioi-one-prompt": (lambda c: _task(c, "ioi", n_prompts=1), InvalidArgumentError, "at least 2"),
    "ioi-one-name": (lambda c: _task(c, "ioi", names=["Mary"]), InvalidArgumentError, "at least 2 words"),
    "ioi-negative-seed": (lambda c: _task(c, "ioi", seed=-1), InvalidArgumentError, "seed"),
    "ioi-unknown-keyword": (lambda c: _task(c, "ioi", prompts=3), InvalidArgumentError, "takes no prompts"),
    "induction-zero-length": (lambda c: _task(c, "induction", length=0), InvalidArgumentError, "length"),
    "induction-negative-length": (lambda c: _task(c, "induction", length=-2), InvalidArgumentError, "length"),
    "induction-longer-than-context": (lambda c: _task(c, "induction", length=100), InputTooLongError, "201 tokens"),
    "induction-float-prompts": (lambda c: raw(__import__("cwlens.circuits.tasks").circuits.tasks.induction)(
        c["model"], n_prompts=2.5), InvalidArgumentError, "n_prompts"),
    "capitals-no-placeholder": (lambda c: _task(c, "capitals", template="The capital is"),
                                InvalidArgumentError, "one {}"),
    "capitals-one-pair": (lambda c: _task(c, "capitals", pairs=[("France", "Paris")]),
                          InvalidArgumentError, "at least 2"),
    "compare-not-a-task": (lambda c: raw(__import__("cwlens.circuits").circuits.compare_with_patching)(c["model"], "ioi"),
                           InvalidArgumentError, "CircuitTask"),
    "agreement-k-zero": (lambda c: raw(__import__("cwlens.circuits").circuits.agreement)(
        _scores(), _scores(), k=0), InvalidArgumentError, "k must be a positive integer"),
    "head-scores-top-negative": (lambda c: raw(type(_scores()).top)(_scores(), -1), InvalidArgumentError, "k must be"),
    "patch-layer-out-of-range": (lambda c: raw(__import__("cwlens.circuits").circuits.patch_heads)(
        c["model"], c["tokens"], lambda lg: lg[:, -1, 0], mode="mean", layers=[9]),
        LayerOutOfRangeError, "Layer 9"),
    "patch-metric-not-callable": (lambda c: raw(__import__("cwlens.circuits").circuits.patch_heads)(
        c["model"], c["tokens"], "logit_diff", mode="mean"), InvalidArgumentError, "metric must be a function"),
}


def _scores():
    from cwlens.circuits import HeadScores

    return HeadScores("x", torch.arange(6, dtype=torch.float64).reshape(2, 3))


@pytest.mark.parametrize("call, error, words", list(API.values()), ids=list(API))
def test_bad_api_input_raises_the_documented_error(ctx, call, error, words):
    with pytest.raises(error) as info:
        call(ctx)
    assert words in str(info.value), str(info.value)


@pytest.mark.parametrize("k, mode", [(0, "corrupt"), (-1, "corrupt"), (2, "both")],
                         ids=["k-zero", "k-negative", "mode-unknown"])
def test_compare_with_patching_checks_before_any_forward_pass(ctx, monkeypatch, k, mode):
    from cwlens.circuits import compare, tasks

    task = tasks.CircuitTask("t", "", ctx["tokens"], ctx["tokens"], (5,), ctx["tokens"][:, :1],
                             None, torch.zeros(1, 1, dtype=torch.long), "")

    def no_model_work(*args, **kwargs):
        raise AssertionError("the model ran before the arguments were checked")

    monkeypatch.setattr(compare, "run_with_cache", no_model_work)
    with pytest.raises((InvalidArgumentError, UnknownOptionError)):
        raw(compare.compare_with_patching)(ctx["model"], task, k=k, mode=mode)


PAST = "241 tokens, past this model's trained context of 128"


def _received(layer, w):
    return w.sum((1, 2))  # [batch, key]: what each key receives


def test_rotary_models_run_a_text_past_the_context_with_a_warning(ctx):
    """RoPE has no table of positions: the stream API runs the whole text (not the
    first n_ctx tokens, as ``model(text)`` would cut it), warning that it is past the
    trained context. Causal attention: the first 128 tokens get what they get alone."""
    model = ctx["model"]
    whole = model.to_tokens(LONG, truncate=False)
    assert whole.shape[-1] == 241
    with pytest.warns(CwlensWarning, match=PAST):
        streamed = raw(cwlens.stream)(model, LONG, _received, attention="eager")
    with pytest.warns(CwlensWarning, match=PAST):
        logits, cache = raw(cwlens.run_with_cache)(model, LONG)
    with pytest.warns(CwlensWarning, match=PAST):
        reduced = raw(cwlens.stream_reduce)(model, LONG, [reducers.ColumnSums("contribution")],
                                            attention="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 128 tokens: no warning
        prefix = raw(cwlens.stream)(model, whole[:, :128], _received, attention="eager")
        logits_128, _ = raw(cwlens.run_with_cache)(model, whole[:, :128])
    assert logits.shape[1] == 241 and [r.shape[-1] for r in streamed] == [241, 241]
    full = raw(cwlens.contribution_weights)(cache, model, 1).sum((1, 2))
    torch.testing.assert_close(streamed[1], full, rtol=1e-4, atol=1e-5)
    # a key's column sum over the first 128 queries is the prefix run's
    for layer in (0, 1):
        head = raw(cwlens.contribution_weights)(cache, model, layer)[:, :, :128, :128].sum((1, 2))
        torch.testing.assert_close(head, prefix[layer], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits[:, :128], logits_128, rtol=1e-4, atol=1e-4)
    sums = reduced["column_sums_contribution"].tensor
    torch.testing.assert_close(sums[1].sum(1)[0], full[0], rtol=1e-4, atol=1e-4)


def test_rotary_tokens_past_the_context_warn_in_every_stream_function(ctx):
    model, tokens = ctx["model"], _long_tokens(ctx)
    with pytest.warns(CwlensWarning, match="129 tokens, past"):
        out = raw(cwlens.stream_geometry)(model, tokens, lambda layer, geo: geo.pattern.shape[-1])
    assert out[1] == [129, 129]


def test_export_cuts_a_text_longer_than_the_context_with_a_warning(ctx):
    from cwlens.report.export import read_tables

    with pytest.warns(CwlensWarning, match="241 tokens and the model's context .* is 128"):
        paths = _export(ctx, texts=[LONG], out_dir=ctx["base"] / "long", max_tokens=None)
    heads = read_tables(paths["heads"].parent)["column_sums"]
    assert heads["key"].max() == 127  # the first 128 tokens


# -- placement and the torchrun environment -------------------------------------------

NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")


@pytest.mark.parametrize("device_map, cuda_count, words", [
    ({"": 0}, 0, "GPU 0, but this machine has no CUDA GPU"),
    ({"model.layers.0": "cuda:3"}, 1, "GPU 3, but this machine has 1 (0..0)"),
    ({"model": "gpu"}, 0, "which is not a device"),
], ids=["gpu-index-on-cpu", "cuda-3-of-1", "not-a-device"])
def test_device_map_naming_an_absent_gpu_names_the_option(device_map, cuda_count, words):
    from cwlens.runs.distributed import World, placement

    with pytest.raises(CwlensError) as info:
        placement(device_map=device_map, env=World(), cuda_count=cuda_count)
    assert "--device-map" in str(info.value) and words in str(info.value)


@NO_GPU
def test_load_model_with_a_gpu_device_map_on_a_cpu_machine(ctx):
    with pytest.raises(CwlensError, match="device_map puts '' on GPU 0"):
        cwlens.load_model(str(ctx["path"]), device_map={"": 0})


@pytest.mark.parametrize("value", ["abc", "-5", "0", "nan", "inf"])
def test_distributed_timeout_must_be_a_number_of_seconds(monkeypatch, value):
    from cwlens.runs import distributed

    monkeypatch.setenv("CWLENS_DIST_TIMEOUT_S", value)
    with pytest.raises(distributed.DistributedError, match="CWLENS_DIST_TIMEOUT_S"):
        distributed._timeout()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TORCHRUN_ENV = {
    "missing-master-addr": ({"MASTER_ADDR": None, "MASTER_PORT": None}, "MASTER_ADDR and MASTER_PORT are not set"),
    "master-port-not-a-number": ({"MASTER_PORT": "http"}, "MASTER_PORT='http' is not a port"),
    "timeout-not-a-number": ({"CWLENS_DIST_TIMEOUT_S": "soon"}, "CWLENS_DIST_TIMEOUT_S='soon'"),
    "peer-never-joins": ({"CWLENS_DIST_TIMEOUT_S": "2"}, "the process group did not form within 2 s"),
}


@pytest.mark.parametrize("command", ["faithfulness", "sinks"])
@pytest.mark.parametrize("changes, words", list(TORCHRUN_ENV.values()), ids=list(TORCHRUN_ENV))
def test_torchrun_environment_errors_are_one_line(ctx, tmp_path, command, changes, words):
    """Rank 0 of a 2-process job, as torchrun starts it, with something wrong in its
    environment (a peer that never joins: nobody else is started)."""
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    extra = ["--samples", "2", "--max-tokens", "12", "--no-progress", "--figures", ""] \
        if command == "faithfulness" else ["--samples", "2", "--max-tokens", "12", "--no-png"]
    run = subprocess.run([sys.executable, "-m", "cwlens", command, "--model", str(ctx["path"]),
                          "--device", "cpu", "--out", str(tmp_path / "o"), *extra],
                         env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    lines = [x for x in run.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("cwlens: error: ") and words in lines[0], run.stderr


# -- the command line ---------------------------------------------------------------------

C = ["circuits", "--no-png", "--model", "{m}", "--out", "{p}/cc", "--figures", "{p}/ccf"]
CLI = {
    "circuits-k-zero": (C + ["--k", "0"], 2, "positive integer"),
    "circuits-k-negative": (C + ["--k", "-1"], 2, "positive integer"),
    "circuits-top-negative": (C + ["--top", "-5"], 2, "positive integer"),
    "circuits-prompts-zero": (C + ["--prompts", "0"], 2, "positive integer"),
    "circuits-length-negative": (C + ["--length", "-3"], 2, "positive integer"),
    "circuits-threshold-nan": (C + ["--threshold", "nan"], 2, "finite number >= 0"),
    "circuits-threshold-negative": (C + ["--threshold", "-0.1"], 2, "finite number >= 0"),
    "circuits-threshold-word": (C + ["--threshold", "high"], 2, "expected a number"),
    "circuits-seed-negative": (C + ["--seed", "-1"], 2, "0 or more"),
    "circuits-prompts-with-capitals": (C + ["--task", "capitals", "--prompts", "3", "--model", "{m}"],
                                       1, "--prompts does not apply to --task capitals"),
    "circuits-length-with-ioi": (C + ["--length", "5", "--model", "{m}"], 1, "--length applies to --task induction"),
    # round 3: ignored without a word / one batch that grew without bound (6.5 GB in 60 s)
    "circuits-ioi-corruption-with-induction": (C + ["--task", "induction", "--ioi-corruption", "swap"],
                                               1, "--ioi-corruption applies to --task ioi only"),
    "circuits-prompts-unbounded": (C + ["--task", "induction", "--prompts", "100000", "--length", "3"],
                                   1, "--prompts 100000: the prompts run as one batch"),
    "circuits-length-past-context": (C + ["--task", "induction", "--length", "100", "--model", "{m}",
                                          "--out", "{p}/c", "--figures", "{p}/cf"],
                                     1, "more than the model's context of 128"),
    "circuits-out-is-a-file": (C + ["--out", "{p}/a_file", "--model", "{m}"], 1, "is a file"),
    "export-blank-text": (["export", "--text", "the cat", "--text", "  ", "--model", "{m}"], 1,
                          "--text number 2 is empty"),
    "replicate-rates-zero": (["replicate", "--rates", "0", "--table-only", "--out", "{p}/empty", "--figures", ""], 2, "every verdict would be a tie"),
    "replicate-rates-one": (["replicate", "--rates", "1", "--table-only", "--out", "{p}/empty", "--figures", ""], 2, "every verdict would be a tie"),
    "replicate-rates-zero-and-one": (["replicate", "--rates", "0,1", "--table-only", "--out", "{p}/empty", "--figures", ""], 2, "every verdict would be a tie"),
    "replicate-empty-model-name": (["replicate", "--models", "a,,b", "--table-only", "--out", "{p}/empty", "--figures", ""], 2, "empty name"),
    "replicate-table-only-without-results": (["replicate", "--models", "smollm2-135m", "--out", "{p}/empty",
                                              "--figures", "", "--table-only"], 1, "holds no results"),
    "faithfulness-device-map-gpu-on-cpu": pytest.param(
        ["faithfulness", "--model", "{m}", "--device-map", '{"": 0}', "--out", "{p}/f", "--figures", ""],
        1, "--device-map puts '' on GPU 0", marks=NO_GPU),
    "sinks-device-map-cuda-on-cpu": pytest.param(
        ["sinks", "--model", "{m}", "--device-map", '{"model": "cuda:1"}', "--out", "{p}/s"],
        1, "--device-map puts 'model' on GPU 1", marks=NO_GPU),
}


def _main(argv, ctx) -> int:
    argv = [a.replace("{p}", str(ctx["base"])).replace("{m}", str(ctx["path"])) for a in argv]
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("argv, code, words", list(CLI.values()), ids=list(CLI))
def test_bad_command_lines_give_one_line(ctx, argv, code, words, capsys, monkeypatch):
    monkeypatch.chdir(ctx["base"])
    got = _main(argv, ctx)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [x for x in err.splitlines() if "error:" in x]
    assert len(errors) == 1 and words in errors[0], err
    assert got == code, err


def _stdin(monkeypatch, data: bytes):
    # a terminal's (lenient) decoding of bytes that are not UTF-8
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8",
                                                       errors="surrogateescape"))


@pytest.mark.parametrize("command", ["analyze", "export"])
@pytest.mark.parametrize("data, words", [(b"caf\xe9 au lait", "not UTF-8"), (b"the\0cat", "binary")],
                         ids=["latin1", "binary"])
def test_bad_standard_input_is_one_line(ctx, command, data, words, capsys, monkeypatch):
    monkeypatch.chdir(ctx["base"])
    _stdin(monkeypatch, data)
    out = "{p}/stdin-out.html" if command == "analyze" else "{p}/stdin-out"
    got = _main([command, "--file", "-", "--model", "{m}", "--out", out], ctx)
    err = capsys.readouterr().err
    assert got == 1 and "Traceback" not in err and words in err, err


@pytest.mark.parametrize("command", ["analyze", "export"])
def test_a_text_longer_than_the_context_is_cut_with_a_note(ctx, command, capsys, monkeypatch):
    monkeypatch.chdir(ctx["base"])
    out = "{p}/long.html" if command == "analyze" else "{p}/long-export"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        got = _main([command, "--text", LONG, "--model", "{m}", "--out", out], ctx)
    err = capsys.readouterr().err
    assert got == 0, err
    notes = [x for x in err.splitlines() if x.startswith("cwlens: note: ")]
    assert any("241 tokens and the model's context (n_ctx) is 128" in x for x in notes), err


def test_a_row_without_a_control_position_counts_its_real_tokens():
    """One real token per row was reported as "real tokens per row [0, 0]" (the candidates)."""
    from cwlens.core.sinks import random_non_sink_index
    from cwlens.errors import ShapeMismatchError

    with pytest.raises(ShapeMismatchError, match=r"real tokens per row \[1, 1\], candidates per row \[0, 0\]"):
        random_non_sink_index(torch.zeros(2, dtype=torch.long), 1)


def test_sinks_api_refuses_empty_layers_odd_positions_and_scales():
    """Round 4: layers=[] gave pandas' "No objects to concatenate" or interventions that
    changed nothing; sink_positions past the text were clamped onto its last token; a text
    instead of token ids, NaN or repeated scales reached the model."""
    import cwlens
    from cwlens import sinks as S
    from cwlens.errors import InvalidArgumentError, LayerOutOfRangeError
    from cwlens.testing import tiny_model

    m = tiny_model("llama")
    text = "When Mary and John went to the store"
    tok = m.to_tokens(text)
    _, cache = cwlens.run_with_cache(m, text)
    for call in (lambda: S.sink_statistics(cache, m, layers=[]),
                 lambda: S.alignment_statistics(cache, m, layers=[]),
                 lambda: S.sweep_statistics(cache, m, layers=[]),
                 lambda: S.sink_norm_intervention(m, tok, layers=[])):
        with pytest.raises(LayerOutOfRangeError, match="no layer given"):
            call()
    for positions, match in (((), "empty"), ((-1,), "0 or more"), ((100,), "past the end"),
                             ((0, 0), "twice")):
        with pytest.raises(InvalidArgumentError, match=match):
            S.sink_statistics(cache, m, sink_positions=positions)
    for eps in (2, -1, float("nan")):
        with pytest.raises(InvalidArgumentError, match=r"in \[0, 1\]"):
            S.sink_statistics(cache, m, eps=eps)
    with pytest.raises(InvalidArgumentError, match="tensor of token ids"):
        S.sink_norm_intervention(m, text)
    for scales, match in (([float("nan")], "finite"), ([0, 0], "twice"), ([], "non-empty")):
        with pytest.raises(InvalidArgumentError, match=match):
            S.sink_norm_intervention(m, tok, scales=scales)


def test_cli_errors_name_the_flag_not_only_the_python_keyword():
    """Round 4: 'pass layer=None', 'n_prompts must be', 'source="hf" gives the full split'
    (wrong for ioi, which has no hub source) reached the command line as they were."""
    from cwlens.datasets import load_dataset
    from cwlens.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError) as err:
        load_dataset("ioi", n=100000)
    assert "(CLI: --samples)" in str(err.value) and "pass 300 or fewer" in str(err.value)
    assert "source=" not in str(err.value)
    with pytest.raises(InvalidArgumentError, match=r'source="hf" gives the full split'):
        load_dataset("gsm8k", n=100000)


def test_key_set_weight_checks_its_arguments_and_results_name_their_reducers():
    """Round 4: keys=0 raised TypeError, metrics='attention' failed at run time with
    "Unknown metric='a'", name='' was accepted, NumPy offsets refused; a missing result
    name raised a bare KeyError."""
    import numpy as np

    import cwlens
    from cwlens import reducers as R
    from cwlens.engine.streaming import UnknownReducerError
    from cwlens.errors import InvalidArgumentError, UnknownOptionError
    from cwlens.testing import tiny_model

    for kwargs, match in (({"keys": 0}, "list of offsets"), ({"metrics": "attention"}, "the string"),
                          ({"metrics": ("nope",)}, "nope"), ({"name": ""}, "name"),
                          ({"keys": (-1,)}, ">= 0"), ({"keys": (1, 1)}, "repeats")):
        with pytest.raises((InvalidArgumentError, UnknownOptionError), match=match):
            R.KeySetWeight(**kwargs)
    assert R.KeySetWeight(keys=(np.int64(0), 1)).keys == (0, 1)
    out = cwlens.stream_reduce(tiny_model("llama"), "the cat sat", [R.HeadSummary()])
    with pytest.raises(UnknownReducerError, match="no reducer named 'top8'.*holds 'heads'"):
        out["top8"]
    with pytest.raises(KeyError):  # still a KeyError
        out["top8"]


def test_a_mask_that_does_not_match_the_cache_is_refused():
    """Round 4: a padded batch cached without its mask, read with it, was off by 0.16;
    a flipped mask sent the real rows to 0 -- both without an error."""
    import cwlens
    from cwlens.engine.batching import pad_batch
    from cwlens.errors import ShapeMismatchError
    from cwlens.testing import tiny_model

    m = tiny_model("llama")
    toks, am = pad_batch(m, ["short one", "When Mary and John went to the store"])
    _, with_mask = cwlens.run_with_cache(m, toks, attention_mask=am)
    cwlens.contribution_weights(with_mask, m, layer=1, attention_mask=am)  # the match: fine
    _, without = cwlens.run_with_cache(m, toks)
    with pytest.raises(ShapeMismatchError, match="does not match attention_mask"):
        cwlens.contribution_weights(without, m, layer=1, attention_mask=am)
    with pytest.raises(ShapeMismatchError, match="does not match attention_mask"):
        cwlens.contribution_weights(with_mask, m, layer=1, attention_mask=am.flip(-1))


def test_a_dataset_path_that_is_a_folder_and_a_docs_folder_are_named(tmp_path):
    from cwlens.datasets import load_dataset
    from cwlens.errors import DatasetFormatError, OutputPathError
    from cwlens.runs.paths import markdown_file

    with pytest.raises(DatasetFormatError, match="is a folder: pass the JSONL file"):
        load_dataset("gsm8k", path=tmp_path)
    with pytest.raises(OutputPathError, match="summary.md"):
        markdown_file(tmp_path, "--docs")


def test_sink_summaries_of_an_empty_table_are_named():
    import pandas as pd

    from cwlens.errors import InvalidArgumentError
    from cwlens.sinks.statistics import head_summary, layer_summary

    for f in (head_summary, layer_summary):
        with pytest.raises(InvalidArgumentError, match="non-empty table of cwlens.sinks.sink_statistics"):
            f(pd.DataFrame())
