"""lm-eval-harness under masking (``cwlens-masked``): lm-eval's scores equal cwlens's own
multiple-choice scores on the same items, clean and masked."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from cwlens.datasets import load_dataset
from cwlens.engine.handle import wrap
from cwlens.errors import UnknownOptionError
from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness
from cwlens.lmeval import task_dir
from cwlens.lmeval.cli import with_task_dir
from cwlens.lmeval.settings import describe, masking_config, parse_layers
from cwlens.testing import save_tiny


def test_cwlens_lmeval_imports_without_lm_eval():
    code = ("import sys, cwlens, cwlens.lmeval, cwlens.lmeval.settings, cwlens.lmeval.scoring; "
            "print('lm_eval' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_missing_lm_eval_names_the_install(monkeypatch):
    import cwlens.lmeval
    from cwlens.errors import CwlensError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "lm_eval" else real(name, *a))
    with pytest.raises(CwlensError, match=r"pip install 'cwlens\[lmeval\]'"):
        cwlens.lmeval.register()


def test_task_yamls_are_shipped():
    names = sorted(p for p in os.listdir(task_dir()))
    assert names == ["cwlens_boolq.yaml", "cwlens_mmlu.yaml", "cwlens_tasks.py",
                     "cwlens_winogrande.yaml"]


def test_model_args_are_checked():
    cfg = masking_config("contribution", "sufficiency", 0.3, scope="head", layers="0;1")
    assert (cfg.metrics, cfg.modes, cfg.rates, cfg.scope, cfg.layers) == (
        ("contribution",), ("sufficiency",), (0.3,), "head", (0, 1))
    for clean in (masking_config(None), masking_config("none", rate=0.3),
                  masking_config("contribution", rate=0)):
        assert clean.rates == (0.0,) and describe(clean)["cwlens_metric"] == "none"
    assert parse_layers(2) == (2,) and parse_layers([0, 3]) == (0, 3) and parse_layers(None) is None
    with pytest.raises(UnknownOptionError, match="metric"):
        masking_config("contributoin", rate=0.3)
    with pytest.raises(UnknownOptionError, match="mode"):
        masking_config("attention", "comprehensive", 0.3)
    with pytest.raises(ValueError, match="rates"):
        masking_config("attention", rate=1.5)
    with pytest.raises(UnknownOptionError, match="layers"):
        parse_layers("0,x")


def test_cli_adds_the_task_dir_once():
    assert with_task_dir(["--tasks", "cwlens_boolq"], "/t") == [
        "--tasks", "cwlens_boolq", "--include_path", "/t"]
    assert with_task_dir(["--include_path", "/mine"], "/t") == ["--include_path", "/mine"]


# --- against lm-eval ----------------------------------------------------------

needs_lm_eval = pytest.mark.skipif(
    importlib.util.find_spec("lm_eval") is None,
    reason="lm-eval is not installed: pip install 'cwlens[lmeval]' (or 'lm-eval>=0.4.9')",
)

# items in the tiny word-level vocabulary (cwlens.testing), in the shipped files' formats
WINOGRANDE = [
    {"sentence": "mary went to the store and _ gave john the milk .", "option1": "she",
     "option2": "he", "answer": "1"},
    {"sentence": "the cat sat on the mat and _ ran fast .", "option1": "it",
     "option2": "they", "answer": "1"},
    {"sentence": "john gave mary a bottle of water and _ was big .", "option1": "the bottle",
     "option2": "the water", "answer": "2"},
    {"sentence": "the dog ran to the house when _ was slow .", "option1": "the car",
     "option2": "the tree", "answer": "2"},
]
BOOLQ = [
    {"question": "is paris the capital of france", "passage": "paris is the capital city of "
     "france . london is the capital of england .", "answer": True},
    {"question": "was the cat red", "passage": "the cat was blue and the dog was green .",
     "answer": False},
]
CONDITIONS = [  # (metric, mode, rate): clean, masked both ways, rate 0 = clean
    (None, "comprehensiveness", 0.0),
    ("contribution", "comprehensiveness", 0.3),
    ("attention", "sufficiency", 0.5),
    ("contribution", "comprehensiveness", 0.0),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import cwlens

    root = tmp_path_factory.mktemp("lmeval")
    files = {}
    for name, rows in (("winogrande", WINOGRANDE), ("boolq", BOOLQ)):
        files[name] = root / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = save_tiny("llama", root)
    return cwlens.load_model(str(path), device="cpu"), files, path


def lm_eval_samples(model, task, metric, mode, rate, data_file=None, limit=None):
    """lm-eval's logged samples (by doc_id) and results for one masking condition."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import cwlens.lmeval

    lm = cwlens.lmeval.register()(model=model, metric=metric, mode=mode, rate=rate,
                                  progress=False)
    meta = {"data_file": str(data_file)} if data_file else {}
    manager = TaskManager(include_path=task_dir(), include_defaults=False, metadata=meta)
    out = simple_evaluate(model=lm, tasks=[task], task_manager=manager, limit=limit,
                                  log_samples=True, verbosity="ERROR")
    return sorted(out["samples"][task], key=lambda s: s["doc_id"]), out


def cwlens_scores(model, items, metric, mode, rate):
    """``{(sample_id, measure): value}`` of ``run_faithfulness`` (clean if metric is None)."""
    cfg = FaithfulnessConfig(metrics=(metric or "contribution",), rates=(rate,), modes=(mode,))
    table = run_faithfulness(model, items, cfg, progress=False).table
    table = table[table.metric == (metric or "none")]
    return {(r.sample_id, r.measure): r.value for r in table.itertuples()}


def assert_same_scores(name, samples, ours, abs_ll):
    """Per document: acc and acc_norm equal, the gold choice's log-likelihood equal."""
    assert len(samples) == len({k[0] for k in ours})
    for s in samples:
        sid = f"{name}-{s['doc_id']:04d}"
        gold = int(s["doc"]["answer"]) - 1 if name == "winogrande" else int(s["doc"]["answer"])
        lls = [r[0][0] for r in s["resps"]]
        assert s["acc"] == ours[sid, "acc"], sid
        if "acc_norm" in s:
            assert s["acc_norm"] == ours[sid, "acc_norm"], sid
        assert lls[gold] == pytest.approx(ours[sid, "gold_ll"], abs=abs_ll, rel=0), sid


@needs_lm_eval
@pytest.mark.parametrize("name", ["winogrande", "boolq"])
@pytest.mark.parametrize("metric,mode,rate", CONDITIONS)
def test_lm_eval_scores_equal_cwlens_scores(tiny, name, metric, mode, rate):
    model, files, _ = tiny
    samples, _ = lm_eval_samples(model, f"cwlens_{name}", metric, mode, rate, files[name])
    items = load_dataset(name, path=files[name])
    ours = cwlens_scores(model, items, metric, mode, rate)
    assert len(samples) == (len(WINOGRANDE) if name == "winogrande" else len(BOOLQ))
    # the task's requests are the items' (context, continuation) pairs, character for character
    assert [[tuple(a) for a in s["arguments"]] for s in samples] == [list(i.pairs) for i in items]
    assert_same_scores(name, samples, ours, abs_ll=1e-9)


def test_requests_split_like_lm_eval(tiny):
    """Empty context: the prefix token (BOS) alone; else cwlens's encode_pair split, the
    input left-truncated to max_length with the continuation kept whole."""
    from cwlens.lmeval.requests import encode_request, token_request

    model, _, _ = tiny
    bos = model.tokenizer.bos_token_id
    words = model.to_tokens("the cat sat", prepend_bos=False)[0].tolist()
    assert encode_request(wrap(model), "", "the cat sat") == ([bos], words)
    ctx, cont = encode_request(wrap(model), "the cat ", "sat")  # the trailing space moves over
    assert (ctx, cont) == ([bos, *words[:2]], words[2:])
    req = token_request([bos, *words[:2]], words[2:], max_length=2)
    assert req.input_ids == tuple(words[:2]) and req.start == 1
    with pytest.raises(Exception, match="does not fit"):
        token_request([bos], words, max_length=2)


@needs_lm_eval
def test_masking_changes_the_scores_and_rate_zero_does_not(tiny):
    model, files, _ = tiny
    lls = {}
    for metric, mode, rate in CONDITIONS:
        samples, _ = lm_eval_samples(model, "cwlens_winogrande", metric, mode, rate,
                                     files["winogrande"])
        lls[metric, mode, rate] = [r[0][0] for s in samples for r in s["resps"]]
    clean = lls[None, "comprehensiveness", 0.0]
    assert lls["contribution", "comprehensiveness", 0.0] == clean
    for key in (("contribution", "comprehensiveness", 0.3), ("attention", "sufficiency", 0.5)):
        assert all(math.isfinite(x) for x in lls[key])
        assert max(abs(a - b) for a, b in zip(lls[key], clean, strict=True)) > 1e-4


@needs_lm_eval
def test_results_record_the_condition(tiny):
    model, files, _ = tiny
    _, out = lm_eval_samples(model, "cwlens_winogrande", "contribution", "sufficiency", 0.3,
                             files["winogrande"])
    cfg = out["config"]
    assert (cfg["cwlens_metric"], cfg["cwlens_mode"], cfg["cwlens_rate"]) == (
        "contribution", "sufficiency", 0.3)


@needs_lm_eval
def test_loglikelihood_rolling_equals_direct_sum(tiny):
    from lm_eval.api.instance import Instance

    import cwlens.lmeval

    model, _, _ = tiny
    text = "the cat sat on the mat and the dog ran fast to the house"
    tokens = model.to_tokens(text)  # [BOS, ...]
    with torch.no_grad():
        logp = torch.log_softmax(model(tokens).double(), -1)
    direct = float(logp[0, :-1].gather(-1, tokens[0, 1:, None]).sum())
    req = Instance("loglikelihood_rolling", {}, (text,), 0)
    lm = cwlens.lmeval.register()(model=model, progress=False)
    assert lm.loglikelihood_rolling([req])[0] == pytest.approx(direct, abs=1e-9)
    # windows of 4 tokens: each predicts from at most 4 tokens of context; all are scored
    short = cwlens.lmeval.register()(model=model, progress=False, max_length=4)
    windowed = short.loglikelihood_rolling([req])[0]
    assert math.isfinite(windowed) and windowed != pytest.approx(direct, abs=1e-6)


@needs_lm_eval
def test_generate_until_is_refused_clearly(tiny):
    import cwlens.lmeval
    from cwlens.errors import CwlensError

    model, _, _ = tiny
    lm = cwlens.lmeval.register()(model=model, progress=False)
    with pytest.raises(CwlensError, match="log-likelihoods only"):
        lm.generate_until([])
    with pytest.raises(CwlensError, match="unknown model_args"):
        cwlens.lmeval.register()(model=model, metrc="attention")


@needs_lm_eval
def test_command_line_runs_offline(tiny, tmp_path):
    _, files, path = tiny
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "cwlens.lmeval", "--model", "cwlens-masked", "--model_args",
           f"pretrained={path},device=cpu,metric=contribution,mode=comprehensiveness,rate=0.3",
           "--tasks", "cwlens_winogrande", "--metadata",
           json.dumps({"data_file": str(files["winogrande"])}),
           "--output_path", str(tmp_path / "out")]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "cwlens_winogrande" in run.stdout and "acc" in run.stdout
    results = list((tmp_path / "out").rglob("results_*.json"))
    acc = json.loads(results[0].read_text())["results"]["cwlens_winogrande"]["acc,none"]
    ours = cwlens_scores(tiny[0], load_dataset("winogrande", path=files["winogrande"]),
                         "contribution", "comprehensiveness", 0.3)
    assert acc == pytest.approx(sum(v for (_, m), v in ours.items() if m == "acc") / len(WINOGRANDE))


@needs_lm_eval
@pytest.mark.slow
@pytest.mark.parametrize("name", ["boolq", "mmlu", "winogrande"])
def test_shipped_tasks_equal_cwlens_on_smollm2(name, smollm2):
    """The shipped tasks' requests are cwlens's items: same scores on SmolLM2."""
    model = smollm2
    items = load_dataset(name, 3)
    for metric, mode, rate in ((None, "comprehensiveness", 0.0),
                               ("contribution", "comprehensiveness", 0.3)):
        samples, _ = lm_eval_samples(model, f"cwlens_{name}", metric, mode, rate, limit=3)
        assert [[tuple(a) for a in s["arguments"]] for s in samples] == [
            list(item.pairs) for item in items]
        assert_same_scores(name, samples, cwlens_scores(model, items, metric, mode, rate),
                           abs_ll=1e-9)


def test_model_args_are_read_strictly():
    """lm-eval passes every model_arg but the literals true/false as a string: bool("no") is
    True, int("1.5") raised a bare ValueError, and seed=1.5 was cut to 1."""
    for off in ("no", "off", "false", "False", "0", 0, False):
        assert masking_config("contribution", rate=0.3, renormalize=off).renormalize is False
        assert masking_config("contribution", rate=0.3, mask_first_token=off).mask_first_token is False
    for on in ("yes", "ON", "true", "1", 1, True):
        assert masking_config("contribution", rate=0.3, renormalize=on).renormalize is True
    with pytest.raises(UnknownOptionError, match="renormalize='maybe'"):
        masking_config("contribution", rate=0.3, renormalize="maybe")
    assert masking_config("random", rate=0.3, seed="7", batch_tokens="512").seed == 7
    for name, bad in (("seed", 1.5), ("seed", "abc"), ("batch_tokens", "2.7")):
        with pytest.raises(UnknownOptionError, match=f"{name}=.*whole number"):
            masking_config("random", rate=0.3, **{name: bad})
    for bad in ("abc", "30%", True):
        with pytest.raises(UnknownOptionError, match="rate=.*fraction"):
            masking_config("attention", rate=bad)
    with pytest.raises(UnknownOptionError, match="listed twice"):
        masking_config("attention", rate=0.3, layers="0;0")
    with pytest.raises(UnknownOptionError, match="layer indices"):
        masking_config("attention", rate=0.3, layers=1.5)
    with pytest.raises(UnknownOptionError, match="label margin"):
        masking_config("attention_gradient", rate=0.3)


# --- #39.4: errors are one line (the cwlens command's contract) -----------------------------


@pytest.fixture
def lm_eval_logs_here(capsys):
    """lm-eval's log handler is made once per process, on the stderr of the test that made
    it (closed when that test ends): drop it before and after, so each run makes its own."""
    import logging

    import lm_eval.utils

    def drop():
        log = logging.getLogger("lm_eval")
        for handler in list(log.handlers):
            if type(handler) is logging.StreamHandler:
                log.removeHandler(handler)
        lm_eval.utils._LOGGING_CONFIGURED = False

    drop()
    yield capsys
    drop()


@needs_lm_eval
@pytest.mark.parametrize("model_args, words", [
    ("metrc=attention", r"unknown model_args 'metrc' \(did you mean 'metric'\?\)"),
    ("metric=attention,rate=1.5", r"rate=.?1\.5.? is outside \[0, 1\]"),
    ("metric=attention,rate=abc", "rate='abc': give a fraction"),
    ("metric=contribuion,rate=0.3", r"Unknown metric='contribuion' \(did you mean 'contribution'\?\)"),
    ("metric=attention_gradient,rate=0.3", "label margin"),
    ("metric=attention,mode=comprehensive,rate=0.3", "mode"),
    ("metric=attention,rate=0.3,scope=rows", "scope"),
    ("metric=attention,rate=0.3,renormalize=maybe", "renormalize='maybe'"),
    ("metric=random,rate=0.3,seed=1.5", "seed=.*whole number"),
    ("metric=attention,rate=0.3,layers=9", "layers=9: Layer 9 is out of range.*layers=all"),
    ("metric=attention,rate=0.3,layers=x", "layers='x'"),
    ("dtype=float17", "dtype='float17' is not a floating torch dtype"),
    ("dtype=int8", "dtype='int8' is not a floating torch dtype"),
    ("max_length=long", "max_length='long': give a whole number of tokens"),
    ("max_length=0", "max_length=.?0.?: give a whole number"),
    ("progress=perhaps", "progress='perhaps'"),
])
def test_every_bad_model_arg_is_one_error_line(tiny, lm_eval_logs_here, model_args, words):
    """metrc, rate=1.5, metric=contribuion printed a full traceback; dtype=float17 ended in
    a raw AttributeError from getattr(torch, dtype), max_length=long in int('long')."""
    from cwlens.lmeval.cli import main

    _, files, path = tiny
    code = main(["--model", "cwlens-masked", "--model_args", f"pretrained={path},device=cpu,{model_args}",
                 "--tasks", "cwlens_winogrande", "--metadata", json.dumps({"data_file": str(files["winogrande"])}),
                 "--limit", "1"])
    err = lm_eval_logs_here.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("cwlens-lm-eval: error: ")]
    assert code == 2 and "Traceback" not in err and len(lines) == 1, err[-2000:]
    assert __import__("re").search(words, lines[0]), lines[0]


@needs_lm_eval
@pytest.mark.parametrize("args, code, words", [
    ("--tasks cwlens_winogrand nope_task", 2,
     r"unknown --tasks 'cwlens_winogrand' \(did you mean 'cwlens_winogrande'\?\), 'nope_task': the cwlens "
     "tasks are cwlens_mmlu"),
    ("--model cwlens-maskd --tasks cwlens_boolq", 2, "'cwlens-maskd'.*pass --model cwlens-masked"),
    ("--model_args pretrained=/no/such/model-dir --tasks cwlens_boolq", 1, "'/no/such/model-dir'"),
    ("--model_args pretrained={path},device=gpu --tasks cwlens_boolq", 1, "Unknown device 'gpu'"),
    pytest.param("--model_args pretrained={path},device=cuda:7 --tasks cwlens_boolq", 1,
                 "'cuda:7' asked for a CUDA GPU, but this machine has none",
                 marks=pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a GPU here")),
])
def test_unknown_tasks_models_and_failed_loads_are_one_line(tiny, lm_eval_logs_here, args, code, words):
    """An unknown --tasks name printed lm-eval's ValueError traceback."""
    from cwlens.lmeval.cli import main

    _, _, path = tiny
    argv = args.format(path=path).split()
    if "--model" not in argv:
        argv = ["--model", "cwlens-masked", *argv]
    if "--model_args" not in argv:
        argv += ["--model_args", f"pretrained={path},device=cpu"]
    got = main([*argv, "--limit", "1"])
    err = lm_eval_logs_here.readouterr().err
    assert got == code and "Traceback" not in err, err[-2000:]
    line = [x for x in err.splitlines() if x.startswith("cwlens-lm-eval: error: ")]
    assert len(line) == 1 and __import__("re").search(words, line[0]), err[-2000:]


@needs_lm_eval
@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the fallback is for machines without CUDA")
def test_lm_evals_default_cuda_loads_on_the_cpu_and_says_so(tiny, capsys):
    """lm-eval passes its own --device (cuda:0 by default) as additional_config: without CUDA
    the model loads on the CPU with a note; a device in --model_args is never replaced
    (cuda:7 used to load on the CPU silently)."""
    from cwlens.errors import DeviceNotAvailableError
    from cwlens.lmeval.model import CwlensMaskedLM

    _, _, path = tiny
    lm = CwlensMaskedLM.create_from_arg_obj({"pretrained": str(path)}, {"device": "cuda:0"})
    assert next(lm.model.parameters()).device.type == "cpu"
    assert "lm-eval's device 'cuda:0' is not on this machine" in capsys.readouterr().err
    with pytest.raises(DeviceNotAvailableError, match="'cuda:7' asked for a CUDA GPU"):
        CwlensMaskedLM.create_from_arg_obj({"pretrained": str(path), "device": "cuda:7"}, {"device": "cpu"})


@needs_lm_eval
def test_command_line_error_is_one_line_and_debug_shows_the_traceback(tiny):
    _, _, path = tiny
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "cwlens.lmeval", "--model", "cwlens-masked", "--model_args",
           f"pretrained={path},device=cpu,dtype=float17", "--tasks", "cwlens_boolq"]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert run.stderr.strip().splitlines()[-1] == (
        "cwlens-lm-eval: error: dtype='float17' is not a floating torch dtype: give float32 (the "
        "default), bfloat16, float16 or float64.")
    debug = subprocess.run([*cmd, "--debug"], capture_output=True, text=True, env=env, timeout=600)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ModelArgsError" in debug.stderr
