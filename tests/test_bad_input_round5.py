"""Round 5 of bad input (a probe with bad values, as a new user would try): each test fails on the code
before its fix. The sinks Python API, its summary file and --plot-only's run record."""

import dataclasses
import json
import shutil

import pytest

from cwlens.cli.main import main
from cwlens.errors import InvalidArgumentError
from cwlens.testing import save_tiny, tiny_model


@pytest.mark.parametrize("settings, words", [
    (dict(intervention="no"), "intervention must be True or False"),
    (dict(eps=float("nan")), r"in \[0, 1\]"),
    (dict(eps=True), r"in \[0, 1\]"),
    (dict(seed=1.5), "seed must be an integer"),
    (dict(swept_batches=-1), "swept_batches must be 0 or more"),
    (dict(scales="0.5"), "scales must be a non-empty list"),
    (dict(scales=0.5), "scales must be a non-empty list"),
])
def test_sink_config_checks_what_the_cli_checks(settings, words):
    """SinkConfig(intervention="no") ran the intervention, eps=nan gave 0 sink heads,
    scales="0.5" became ('0', '.', '5')."""
    from cwlens.sinks.config import SinkConfig

    with pytest.raises(InvalidArgumentError, match=words):
        SinkConfig(**settings)


def test_sink_runs_refuse_repeated_ids_and_plain_strings(tmp_path):
    """run_to_folder kept one text per id without a word (3 in, 1 analysed); analyse raised
    pandas' InvalidIndexError; plain strings raised AttributeError 'id'."""
    from cwlens.datasets import load_dataset
    from cwlens.sinks import run as sr
    from cwlens.sinks.token_classes import class_shares

    m = tiny_model("llama")
    same = [dataclasses.replace(s, id="doc") for s in load_dataset("gsm8k", n=3)]
    with pytest.raises(InvalidArgumentError, match="sample id 'doc' is given 3 times"):
        sr.run_to_folder(m, same, tmp_path / "dup", max_tokens=12, progress=False)
    with pytest.raises(InvalidArgumentError, match="sample id 'doc' is given 3 times"):
        sr.analyse(m, same, max_tokens=12, progress=False)
    with pytest.raises(InvalidArgumentError, match="TextSample"):
        sr.analyse(m, ["the cat sat on the mat"], max_tokens=12, progress=False)
    with pytest.raises(InvalidArgumentError, match="a single text: pass"):
        class_shares(m, "the cat sat")
    import torch

    with pytest.raises(InvalidArgumentError, match="non-empty strings"):
        class_shares(m, [torch.tensor([1, 4, 26])])


@pytest.fixture(scope="module")
def sink_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("round5")
    model = save_tiny("llama", base)
    out = base / "run"
    assert main(["sinks", "--model", str(model), "--samples", "2", "--max-tokens", "12",
                 "--out", str(out), "--figures", ""]) == 0
    return base, model, out


def test_read_summary_names_what_is_wrong(sink_run, tmp_path):
    from cwlens.sinks.run import read_summary

    base, _, out = sink_run
    assert read_summary(out / "summary.json") == read_summary(out)  # the file itself works
    with pytest.raises(InvalidArgumentError, match="does not exist: pass the --out folder"):
        read_summary(tmp_path)
    with pytest.raises(InvalidArgumentError, match="folder of a sink run"):
        read_summary(None)
    from cwlens.sinks.store import SinkResultsError

    (tmp_path / "summary.json").write_text("{trunc")
    with pytest.raises(SinkResultsError, match="not valid JSON"):
        read_summary(tmp_path)
    (tmp_path / "summary.json").write_text("[1, 2]")
    with pytest.raises(SinkResultsError, match="holds a list"):
        read_summary(tmp_path)


def test_plot_only_keeps_the_stored_run_record(sink_run, tmp_path, capsys):
    """Without summary.json, --plot-only recorded the *asked* model, dataset and max-tokens
    as the run's (and titled the figures so); a cut summary.json raised JSONDecodeError; a
    different --dataset was not noted."""
    base, model, out = sink_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "summary.json").unlink()
    other = save_tiny("gpt2", tmp_path)
    assert main(["sinks", "--model", str(other), "--samples", "2", "--max-tokens", "40",
                 "--dataset", "fineweb_edu", "--out", str(copy), "--figures",
                 str(tmp_path / "figs"), "--no-png", "--plot-only"]) == 0
    captured = capsys.readouterr()
    record = json.loads((copy / "summary.json").read_text())
    assert (record["model"], record["dataset"], record["max_tokens"]) == (str(model), "gsm8k", 12)
    assert "--dataset gsm8k (asked: fineweb_edu)" in " ".join(captured.err.split())
    assert "sink summary (2 texts of gsm8k;" in captured.out
    html = (tmp_path / "figs" / "sinks_sweep.html").read_text()
    assert str(other) not in html
    (copy / "summary.json").write_text("{trunc")
    assert main(["sinks", "--out", str(copy), "--figures", str(tmp_path / "figs"), "--no-png",
                 "--plot-only"]) == 0
    assert json.loads((copy / "summary.json").read_text())["model"] == str(model)


def test_a_fresh_run_removes_the_tables_it_does_not_write(sink_run, tmp_path):
    """--no-resume --no-intervention left the earlier run's ppl / norm tables beside the
    new ones (two runs mixed for a reader of the CSVs)."""
    base, model, out = sink_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    assert (copy / "ppl.csv").exists()
    assert main(["sinks", "--model", str(model), "--samples", "2", "--max-tokens", "10",
                 "--out", str(copy), "--figures", "", "--no-resume", "--no-intervention"]) == 0
    assert not (copy / "ppl.csv").exists() and not (copy / "norm_intervention.csv").exists()


def test_run_faithfulness_refuses_samples_it_would_mislabel(tmp_path):
    """Repeated ids kept one sample without a word; a second dataset's rows were labelled
    with the first's name; strings and mixed kinds raised AttributeError; out=<folder>
    read as results whose config file is missing."""
    from cwlens.datasets import load_dataset
    from cwlens.faithfulness import FaithfulnessConfig, run_faithfulness

    m = tiny_model("llama")
    cfg = FaithfulnessConfig(metrics=("attention",), rates=(0.5,), max_tokens=10)
    docs = load_dataset("gsm8k", n=3)
    cases = [
        ([dataclasses.replace(s, id="same") for s in docs], "sample id 'same' is given 3 times"),
        (docs[:1] + load_dataset("fineweb_edu", n=1), "come from 2 datasets"),
        (["the cat sat on the mat"], "TextSample or ChoiceItem"),
        (docs[:1] + load_dataset("mmlu", n=1), "mix documents"),
    ]
    for samples, words in cases:
        with pytest.raises(InvalidArgumentError, match=words):
            run_faithfulness(m, samples, cfg, progress=False)
    with pytest.raises(InvalidArgumentError, match="is a folder; pass the path of a .jsonl"):
        run_faithfulness(m, docs, cfg, out=tmp_path, progress=False)
    assert len(run_faithfulness(m, docs, cfg, progress=False).table["sample_id"].unique()) == 3


def test_a_csv_export_reads_back_as_its_parquet_twin(tmp_path):
    """read_tables read CSV ids with pandas' defaults: 'NA' became NaN and '007' became 7.0
    (a join with a Parquet export matched nothing)."""
    import pandas as pd

    from cwlens.report.export import export_texts, read_tables

    m = tiny_model("llama")
    for fmt in ("parquet", "csv"):
        export_texts(m, ["the cat", "the dog"], tmp_path / fmt, text_ids=["NA", "007"], fmt=fmt)
    pq, csv = read_tables(tmp_path / "parquet"), read_tables(tmp_path / "csv")
    assert list(csv["heads"]["text_id"].unique()) == ["NA", "007"]
    for name in pq:
        pd.testing.assert_frame_equal(pq[name].reset_index(drop=True), csv[name].reset_index(drop=True),
                                      check_dtype=False, atol=1e-6)


def test_export_refuses_one_token_and_a_string_of_ids(tmp_path, capsys):
    """--max-tokens 1 exported <bos> rows only (rc 0; analyze refuses it); text_ids="ab" was
    split into the ids 'a' and 'b'."""
    from cwlens.report.export import export_texts

    m = tiny_model("llama")
    with pytest.raises(InvalidArgumentError, match="max_tokens=1 keeps one token"):
        export_texts(m, ["the cat sat"], tmp_path / "a", max_tokens=1)
    with pytest.raises(InvalidArgumentError, match="text_ids must be a list"):
        export_texts(m, ["the cat", "the dog"], tmp_path / "b", text_ids="ab")
    model = save_tiny("llama", tmp_path)
    assert main(["export", "--model", str(model), "--device", "cpu", "--text", "hello world",
                 "--max-tokens", "1", "--out", str(tmp_path / "c")]) == 1
    assert "--max-tokens" in capsys.readouterr().err
    assert not (tmp_path / "c" / "topk.parquet").exists()


def test_export_helpers_refuse_a_string_of_tokens():
    """reduction_tables(res, "abcd") took characters as token strings."""
    from cwlens.engine.streaming import stream_reduce
    from cwlens.report.export import circuitsvis_heads, default_reducers, reduction_tables

    m = tiny_model("llama")
    res = stream_reduce(m, m.to_tokens("the cat sat"), default_reducers())
    with pytest.raises(InvalidArgumentError, match="str_tokens must be a list"):
        reduction_tables(res, "abcd")
    import torch

    with pytest.raises(InvalidArgumentError, match="str_tokens must be a list"):
        circuitsvis_heads(torch.ones(2, 4, 4), "abcd")


@pytest.fixture(scope="module")
def circuit(tmp_path_factory):
    from cwlens import circuits

    m = tiny_model("llama")
    task = circuits.build_task("induction", m, n_prompts=2, length=5)
    logits, cache = circuits.run_with_cache(m, task.clean)
    return m, task, logits, cache


def test_token_flow_checks_positions_tokens_and_its_cache(circuit):
    """target=999 wrapped round to position 9 (another token's graph); str_tokens of the
    wrong length failed later with IndexError; a cwlens.run_with_cache cache was told to
    use cwlens.run_with_cache."""
    import cwlens
    from cwlens import circuits
    from cwlens.errors import MissingHookError, ShapeMismatchError

    m, task, _, cache = circuit
    n = task.clean.shape[1]
    flow = circuits.token_flow(cache, m, batch=0)
    assert flow.edges(target=-1) == flow.edges(target=n - 1)
    for bad in (n, 999, -n - 1):
        with pytest.raises(InvalidArgumentError, match=f"target position {bad} is out of range"):
            flow.edges(target=bad)
    with pytest.raises(InvalidArgumentError, match="integer position"):
        flow.input_attribution(2.5)
    with pytest.raises(ShapeMismatchError, match=f"list of {n} token strings"):
        circuits.token_flow(cache, m, str_tokens=["a"])
    with pytest.raises(ShapeMismatchError, match="a string"):
        circuits.token_flow(cache, m, str_tokens="abc")
    with pytest.raises(InvalidArgumentError, match="batch 5 is out of range"):
        circuits.token_flow(cache, m, batch=5)
    _, plain = cwlens.run_with_cache(m, "the cat sat")
    with pytest.raises(MissingHookError, match=r"cwlens.circuits.run_with_cache\(model, tokens\)"):
        circuits.token_flow(plain, m)


def test_head_scores_and_logit_attribution_check_positions_and_ids(circuit):
    """Empty queries gave all-NaN scores, a key after its query a 'measured' 0, positions
    and token ids out of range raised bare IndexError / RuntimeError."""
    import torch

    from cwlens import circuits
    from cwlens.errors import NonFiniteError, ShapeMismatchError

    m, task, logits, cache = circuit
    b, n = task.clean.shape
    q = task.queries
    assert torch.equal(circuits.head_scores(cache, m, q, task.keys)["contribution_key"].values,
                       circuits.head_scores(cache, m, [x - n if x >= 0 else x for x in q],
                                            task.keys)["contribution_key"].values)
    with pytest.raises(InvalidArgumentError, match="queries is empty"):
        circuits.head_scores(cache, m, (), None)
    with pytest.raises(InvalidArgumentError, match="queries position 99 is out of range"):
        circuits.head_scores(cache, m, (99,), task.keys[:, :1])
    with pytest.raises(InvalidArgumentError, match="outside 0.."):
        circuits.head_scores(cache, m, (2,), torch.full((b, 1), 100))
    with pytest.raises(InvalidArgumentError, match="after its query"):
        circuits.head_scores(cache, m, (2,), torch.full((b, 1), 8))
    with pytest.raises(InvalidArgumentError, match="keys must be a"):
        circuits.head_scores(cache, m, (2,), [[1], [1]])
    with pytest.raises(ShapeMismatchError, match="one key per query"):
        circuits.head_scores(cache, m, (2,), torch.ones(b + 1, 1, dtype=torch.long))
    dla = circuits.direct_logit_attribution
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        dla(cache, m, logits, q, torch.full_like(task.answers, 10**6), None)
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        dla(cache, m, logits, q, task.answers, torch.full_like(task.answers, -1))
    with pytest.raises(ShapeMismatchError, match="logits of the cached run"):
        dla(cache, m, logits[:1], q, task.answers, None)
    with pytest.raises(NonFiniteError, match="NaN or inf"):
        dla(cache, m, torch.full_like(logits, float("nan")), q, task.answers, None)
    assert dla(cache, m, logits, q, task.answers, task.foils).completeness_error < 1e-4


def test_an_item_past_the_context_gets_advice_that_applies(tmp_path, capsys):
    """A BoolQ passage past the context was told to use --num-fewshot (MMLU's only flag),
    and `accuracy --dataset mmlu,boolq` scored MMLU first, then failed without its table."""
    model = str(save_tiny("llama", tmp_path))  # n_ctx 128: BoolQ passages are longer
    assert main(["accuracy", "--model", model, "--device", "cpu", "--dataset", "mmlu,boolq",
                 "--samples", "mmlu=2,boolq=2"]) == 1
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert "boolq items are zero-shot, so only a model with a longer context" in err
    assert "--num-fewshot" not in err
    assert "mmlu:" not in captured.out  # refused before any scoring


@pytest.mark.parametrize("bad, words", [
    ("half", "0 \\(padding\\) and 1"), ("zeros", "has no real token"), ("list", "tensor of 0/1"),
    ("3d", "must be \\[batch, pos\\]"),
])
def test_attention_geometry_checks_its_position_mask(bad, words):
    """A 0.5 mask summed contributions to 14 over 7 positions (read as all ones), an
    all-zero one to 0; a list raised AttributeError."""
    import torch

    from cwlens.core.geometry import AttentionGeometry
    from cwlens.errors import CwlensError
    from cwlens.testing import random_layer

    p, v, W = random_layer()[:3]
    b, k = p.shape[0], p.shape[-1]
    ok = torch.ones(b, k)
    AttentionGeometry(p, v, W, ok).contribution()
    mask = {"half": torch.full((b, k), 0.5), "zeros": torch.zeros(b, k), "list": ok.tolist(),
            "3d": ok[None]}[bad]
    with pytest.raises(CwlensError, match=words):
        AttentionGeometry(p, v, W, mask)


def test_small_cli_messages(tmp_path, capsys):
    """'all' inside a list was 'unknown' and then offered as valid; analyze --out newdir/
    said the new folder 'is a folder'; sinks had no --no-progress."""
    from cwlens.cli import arg_types
    from cwlens.runs.paths import output_file

    parse = arg_types.choice_list(("attention", "random"), "metric", allow_all=True)
    with pytest.raises(arg_types.Error, match="'all' stands alone"):
        parse("all,random")
    assert parse("all") == ("attention", "random")
    from cwlens.errors import CwlensError

    with pytest.raises(CwlensError, match="ends with '/', which names a folder"):
        output_file(str(tmp_path / "newdir") + "/")
    model = save_tiny("llama", tmp_path)
    capsys.readouterr()
    assert main(["sinks", "--model", str(model), "--samples", "1", "--max-tokens", "8",
                 "--out", str(tmp_path / "s"), "--figures", "", "--no-intervention",
                 "--no-progress"]) == 0
    assert "batch" not in capsys.readouterr().err


def test_an_edited_file_is_named_on_resume(tmp_path, capsys):
    """An edited --file was refused with "differs in samples" alone."""
    model = str(save_tiny("llama", tmp_path))
    doc = tmp_path / "doc.txt"
    argv = ["faithfulness", "--model", model, "--device", "cpu", "--file", str(doc), "--metrics",
            "attention", "--rates", "0.5", "--out", str(tmp_path / "f"), "--figures", "",
            "--no-progress"]
    doc.write_text("the cat sat on the mat and the dog ran")
    assert main(argv) == 0
    doc.write_text("the cat sat on the mat and the dog ran away")
    assert main(argv) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "the file changed since the stored run" in err
