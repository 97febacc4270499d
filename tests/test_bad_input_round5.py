"""Round 5 of bad input (a helper's probe, /work notes): each test fails on the code
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
    (tmp_path / "summary.json").write_text("{trunc")
    with pytest.raises(InvalidArgumentError, match="not valid JSON"):
        read_summary(tmp_path)
    (tmp_path / "summary.json").write_text("[1, 2]")
    with pytest.raises(InvalidArgumentError, match="holds a list"):
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
