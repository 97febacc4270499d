"""Every bad command line ends in one explained line and exit 1 or 2, never a traceback.

Usage errors (argparse ``type=`` checks) exit 2 with ``cwlens <command>: error: ...``;
errors cwlens explains (paths, counts, models, out-of-range layers) exit 1 with
``cwlens: error: ...``. Everything except the layer/head ranges is checked before the
model loads; those are checked right after, before any compute.
"""

import builtins
import io
import os

import pytest
import torch

from cwlens.cli.main import main
from cwlens.testing import save_tiny


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    base = tmp_path_factory.mktemp("bad-input")
    (base / "a_file").write_text("x")
    (base / "a_dir").mkdir()
    (base / "empty_dir").mkdir()
    (base / "other_results").mkdir()
    (base / "other_results" / "file_long.jsonl").write_text("")
    (base / "binary.txt").write_bytes(b"the cat\0\1\2")
    (base / "latin1.txt").write_bytes("café au lait".encode("latin-1"))
    (base / "corrupt_model").mkdir()
    (base / "corrupt_model" / "config.json").write_text("{ not json")
    save_tiny("llama", base)  # base / "tiny-lm"
    return base


NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
F = ["faithfulness", "--no-progress", "--no-png"]
S = ["sinks", "--no-png"]
A = ["analyze", "--text", "the cat sat"]

# (argv with {p} for the fixture folder, exit code, text the error line must contain)
CASES = {
    # -- usage errors (argparse types): exit 2 ------------------------------------------
    "rates-empty": (F + ["--rates", ""], 2, "comma-separated list of rates"),
    "metrics-empty": (F + ["--metrics", ""], 2, "comma-separated list of metrics, e.g. attention,"),
    "figures-named-like-a-file": (F + ["--figures", "{p}/curves.png", "--out", "{p}/o1"], 1,
                                  "names a file (.png), but it is a folder"),
    "rates-above-1": (F + ["--rates", "1.5"], 2, "[0, 1]"),
    "rates-negative": (F + ["--rates", "-0.1"], 2, "[0, 1]"),
    "rates-not-a-number": (F + ["--rates", "abc"], 2, "not a number"),
    "rates-duplicate": (F + ["--rates", "0.3,0.3"], 2, "listed twice"),
    "rates-empty-item": (F + ["--rates", "0.1,,0.3"], 2, "comma-separated"),
    "rates-nan": (F + ["--rates", "nan"], 2, "not a finite number"),
    "figures-blank": (F + ["--figures", " ", "--out", "{p}/o2"], 1, "--figures ' ' is blank"),
    # round 4: '' was read as '.', so the files landed in the working directory
    "sinks-max-tokens-one": (S + ["--max-tokens", "1", "--no-intervention", "--out", "{p}/s1", "--figures", ""], 1,
                             "--max-tokens) leaves the sink alone"),
    "out-empty-faithfulness": (F + ["--out", ""], 1, "--out is empty: pass a path ('.' for the current folder)"),
    "out-empty-demo": (["demo", "--out", ""], 1, "--out is empty"),
    "out-empty-export": (["export", "--text", "a b", "--out", ""], 1, "--out is empty"),
    "out-empty-sinks": (S + ["--out", "", "--figures", ""], 1, "--out is empty"),
    "out-empty-circuits": (["circuits", "--out", ""], 1, "--out is empty"),
    "out-empty-analyze": (A + ["--out", ""], 1, "--out is empty"),
    "rates-underflow": (F + ["--rates", "0.1,1e-400"], 2, "'1e-400' in '0.1,1e-400' is too small"),
    "scales-underflow": (S + ["--scales", "1,2e-999"], 2, "would be read as 0"),
    "samples-zero": (F + ["--samples", "0"], 2, "positive integer"),
    "samples-negative": (F + ["--samples", "-5"], 2, "positive integer"),
    "samples-word": (F + ["--samples", "many"], 2, "positive integer"),
    "samples-named-zero": (F + ["--samples", "gsm8k=0"], 2, "gsm8k: must be a positive"),
    "samples-named-twice": (F + ["--samples", "gsm8k=5,gsm8k=6"], 2, "given twice"),
    "max-tokens-zero": (F + ["--max-tokens", "0"], 2, "positive number of tokens"),
    "max-tokens-negative": (S + ["--max-tokens", "-3"], 2, "positive number of tokens"),
    "batch-tokens-zero": (F + ["--batch-tokens", "0"], 2, "positive integer"),
    "layers-float": (F + ["--layers", "1.5"], 2, "not a layer index"),
    "layers-negative": (F + ["--layers", "-1"], 2, "start at 0"),
    "layers-duplicate": (F + ["--layers", "0,0"], 2, "listed twice"),
    "dataset-duplicate": (F + ["--dataset", "gsm8k,gsm8k"], 2, "listed twice"),
    "dataset-unknown": (F + ["--dataset", "gsm9k"], 2, "unknown dataset 'gsm9k'"),
    "metric-unknown": (F + ["--metrics", "saliency"], 2, "unknown metric 'saliency'"),
    "mode-unknown": (F + ["--modes", "both"], 2, "unknown mode 'both'"),
    "fewshot-out-of-range": (F + ["--num-fewshot", "9"], 2, "invalid choice"),
    "sinks-samples-zero": (S + ["--samples", "0"], 2, "positive integer"),
    "batch-size-zero": (S + ["--batch-size", "0"], 2, "positive integer"),
    "batch-size-word": (S + ["--batch-size", "two"], 2, "positive integer"),
    "scales-not-a-number": (S + ["--scales", "0,abc"], 2, "not a number"),
    "scales-empty": (S + ["--scales", ""], 2, "comma-separated list of scales"),
    "scales-inf": (S + ["--scales", "inf"], 2, "not a finite number"),
    "sinks-choice-dataset": (S + ["--dataset", "mmlu"], 2, "unknown dataset 'mmlu'"),
    "eps-above-1": (S + ["--eps", "2"], 2, "[0, 1]"),
    "eps-underflow": (S + ["--eps", "1e-400"], 2, "would be read as 0"),
    "sample-negative": (["demo", "--sample", "-1"], 2, "0 or more"),
    "heads-zero": (["demo", "--heads", "0"], 2, "positive integer"),
    "demo-max-tokens-zero": (["demo", "--max-tokens", "0"], 2, "positive number of tokens"),
    "file-missing": (["analyze", "--file", "{p}/missing.txt"], 2, "does not exist"),
    "file-is-a-dir": (["analyze", "--file", "{p}/a_dir"], 2, "is a directory"),
    "file-binary": (["analyze", "--file", "{p}/binary.txt"], 2, "binary file"),
    "file-not-utf8": (["analyze", "--file", "{p}/latin1.txt"], 2, "not UTF-8"),
    "analyze-layers-words": (A + ["--layers", "a,b"], 2, "not a layer index"),
    "analyze-max-mb-negative": (A + ["--max-mb", "-3"], 2, "must be a positive number"),
    "analyze-window-zero": (A + ["--window", "0"], 2, "--window"),
    "device-unknown": (["demo", "--device", "tpu"], 2, "Unknown device 'tpu'"),
    "device-bad-index": (["demo", "--device", "cuda:x"], 2, "Unknown device"),
    "device-cpu-index": (["demo", "--device", "cpu:1"], 2, "there is one CPU device"),
    "export-samples-with-text": (["export", "--text", "the cat", "--samples", "3"], 1,
                                 "--samples applies to --dataset only (this run exports --text)"),
    "device-cuda-without-gpu": pytest.param(
        ["demo", "--device", "cuda"], 2, "--device cpu", marks=NO_GPU),
    "figures-unknown-step": (["figures", "--only", "plots"], 2, "unknown step 'plots'"),
    # -- explained errors before the model loads: exit 1 --------------------------------
    "too-many-samples": (F + ["--dataset", "fineweb_edu", "--samples", "151"], 1, "has only 150 rows"),
    "sinks-too-many-samples": (S + ["--dataset", "fineweb_edu", "--samples", "151"], 1, "has only 150 rows"),
    "samples-for-another-dataset": (F + ["--samples", "mmlu=5"], 1, "no count for gsm8k"),
    "samples-extra-dataset": (F + ["--samples", "gsm8k=5,mmlu=5"], 1, "does not list"),
    "fewshot-without-mmlu": (F + ["--num-fewshot", "2"], 1, "mmlu only"),
    "out-is-a-file": (F + ["--out", "{p}/a_file"], 1, "is a file"),
    "out-under-a-file": (F + ["--out", "{p}/a_file/runs"], 1, "is a file, not a folder"),
    "out-unwritable": (F + ["--out", "/proc/self/cwlens-runs"], 1, "no permission"),
    "report-only-without-results": (F + ["--report-only", "--out", "{p}/empty_dir"], 1, "no results"),
    "report-only-other-dataset": (F + ["--report-only", "--out", "{p}/other_results"], 1,
                                  "holds results of file_long: pass --dataset"),
    "summary-md-is-a-dir": (F + ["--summary-md", "{p}/a_dir", "--out", "{p}/o1"], 1, "is a folder"),
    "summary-md-is-a-notebook": (F + ["--summary-md", "{p}/nb.ipynb", "--out", "{p}/o1"], 1,
                                 "is not a Markdown page"),
    # round 3: the same page twice was written twice; a trailing comma was accepted
    "summary-md-twice": (F + ["--summary-md", "{p}/a.md,{p}/./a.md", "--out", "{p}/o1"], 2,
                         "markdown file listed twice"),
    "summary-md-empty-item": (F + ["--summary-md", "{p}/a.md,", "--out", "{p}/o1"], 2,
                              "expected a comma-separated list of markdown files"),
    "accuracy-summary-md-twice": (["accuracy", "--summary-md", "a.md,a.md"], 2, "listed twice"),
    # round 4: a count for a dataset not run was dropped (faithfulness refuses it); --file
    # is one document, so --samples did nothing
    "accuracy-samples-extra-dataset": (["accuracy", "--dataset", "ioi", "--samples", "ioi=2,capital=3"], 1,
                                       "--samples gives a count for capital, which --dataset (ioi)"),
    "faithfulness-file-with-samples": (F + ["--file", "{p}/a_file", "--samples", "5", "--out", "{p}/o3"], 1,
                                       "--samples applies to --dataset only"),
    "report-out-is-a-notebook": (A + ["--out", "{p}/nb.ipynb"], 1, "is not an .html file"),
    "sinks-out-is-a-file": (S + ["--out", "{p}/a_file"], 1, "is a file"),
    "sinks-figures-is-a-file": (S + ["--figures", "{p}/a_file"], 1, "is a file"),
    "plot-only-without-tables": (S + ["--plot-only", "--out", "{p}/empty_dir", "--figures", "{p}/f"], 1, "no sink tables"),
    "sample-past-the-end": (["demo", "--sample", "100000"], 1, "problems 0..499"),
    "demo-out-is-a-file": (["demo", "--out", "{p}/a_file"], 1, "is a file"),
    "report-out-is-a-dir": (A + ["--out", "{p}/a_dir"], 1, "is a folder"),
    "report-out-unwritable": (A + ["--out", "/proc/self/report.html"], 1, "no permission"),
    "text-blank": (["analyze", "--text", "   "], 1, "the text is empty"),
    "figures-out-is-a-file": (["figures", "--out", "{p}/a_file"], 1, "is a file"),
    "model-unknown": (A + ["--model", "no-such-model"], 1, "Unknown model 'no-such-model'"),
    "model-is-a-file": (A + ["--model", "{p}/a_file"], 1, "is a file, not a model directory"),
    "model-dir-without-config": (A + ["--model", "{p}/a_dir"], 1, "has no config.json"),
    "model-corrupt-config": (A + ["--model", "{p}/corrupt_model"], 1, "not a complete Hugging Face model"),
    "hub-id-offline": (A + ["--model", "no-such-org/no-such-model"], 1, "HF_HUB_OFFLINE"),
    # -- ranges checked against the model, before any compute: exit 1 ------------------
    "analyze-layer-out-of-range": (A + ["--model", "{p}/tiny-lm", "--layers", "0,5"], 1, "--layers 5 out of range"),
    "demo-too-many-heads": (["demo", "--model", "{p}/tiny-lm", "--heads", "5", "--out", "{p}/d"], 1, "--heads 2 or fewer"),
    "faithfulness-layer-out-of-range": (
        F + ["--model", "{p}/tiny-lm", "--samples", "1", "--layers", "7", "--out", "{p}/o2"], 1, "Layer 7 is out of range"),
}


@pytest.mark.parametrize("argv, code, message", list(CASES.values()), ids=list(CASES))
def test_bad_input_gives_one_line_and_no_traceback(argv, code, message, paths, capsys, monkeypatch):
    monkeypatch.chdir(paths)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = [a.replace("{p}", str(paths)) for a in argv]
    if "--device" not in argv:
        argv += ["--device", "cpu"]
    if code == 2:
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        got = exit_.value.code
    else:
        got = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    prefix = "cwlens: error: " if code == 1 else f"cwlens {argv[0]}: error: "
    assert errors[0].startswith(prefix), err
    assert message in errors[0], err
    assert got == code, err


def test_debug_shows_the_traceback(paths, monkeypatch):
    monkeypatch.chdir(paths)
    with pytest.raises(Exception, match="is a file"):
        main(["--debug", "demo", "--out", str(paths / "a_file"), "--device", "cpu"])
    with pytest.raises(Exception, match="is a file"):
        main(["demo", "--debug", "--out", str(paths / "a_file"), "--device", "cpu"])


def test_os_errors_are_one_line(monkeypatch, capsys, paths):
    """An OSError from deep inside (a disk that fills up) is one line, exit 1."""
    from cwlens.cli import demo

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device", str(paths / "d" / "x.html"))

    monkeypatch.setattr(demo, "run", full)
    assert main(["demo", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [f"cwlens: error: No space left on device: '{paths}/d/x.html'"]


def test_read_only_results_with_nothing_left_to_compute(paths, tmp_path, capsys, monkeypatch):
    """A finished faithfulness run reported again from a read-only folder: no write, exit 0."""
    out = tmp_path / "runs"
    argv = F + ["--model", str(paths / "tiny-lm"), "--device", "cpu", "--samples", "2",
                "--max-tokens", "12", "--rates", "0.5", "--metrics", "attention",
                "--out", str(out), "--figures", ""]
    assert main(argv) == 0
    before = {p: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    _make_read_only(monkeypatch, out)
    assert main(argv) == 0, capsys.readouterr().err
    assert {p: p.read_bytes() for p in out.iterdir()} == before
    assert "gsm8k: 0 forward passes" in capsys.readouterr().out


def test_read_only_sink_tables_redraw(paths, tmp_path, capsys, monkeypatch):
    """``cwlens sinks --plot-only`` on a read-only results folder redraws without writing there."""
    out, figs = tmp_path / "sinks", tmp_path / "figs"
    argv = S + ["--model", str(paths / "tiny-lm"), "--device", "cpu", "--samples", "2",
                "--max-tokens", "12", "--batch-size", "2", "--out", str(out), "--figures", str(figs)]
    assert main(argv) == 0
    capsys.readouterr()
    _make_read_only(monkeypatch, out)
    assert main(argv + ["--plot-only"]) == 0, capsys.readouterr().err


def _make_read_only(monkeypatch, folder):
    """Writes under ``folder`` fail with EACCES, as on a read-only mount (tests run as root,
    for whom chmod does not stop writes)."""
    folder = str(folder)
    real_open, real_os_open = builtins.open, os.open

    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))

    def inside(path) -> bool:
        return str(os.path.abspath(os.fspath(path))).startswith(folder)

    def guarded_open(file, mode="r", *args, **kwargs):
        if isinstance(file, str | os.PathLike) and inside(file) and any(c in mode for c in "wax+"):
            denied(file)
        return real_open(file, mode, *args, **kwargs)

    def guarded_os_open(path, flags, *args, **kwargs):
        writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
        if inside(path) and flags & writes:
            denied(path)
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(io, "open", guarded_open)  # pathlib writes through io.open
    monkeypatch.setattr(os, "open", guarded_os_open)
    for name in ("replace", "rename", "unlink", "remove", "mkdir"):
        real = getattr(os, name)

        def guarded(path, *args, _real=real, **kwargs):
            if inside(path):
                denied(path)
            return _real(path, *args, **kwargs)

        monkeypatch.setattr(os, name, guarded)
    import cwlens.runs.paths as arg_types

    real_writable = arg_types._writable
    monkeypatch.setattr(arg_types, "_writable", lambda p: not inside(p) and real_writable(p))


def test_a_document_of_one_token_is_refused(tmp_path, capsys):
    """--max-tokens 1 (or a one-token --file) has no next-token loss: it printed a perfect
    perplexity of 1.00."""
    from cwlens.cli.main import main
    from cwlens.testing import save_tiny

    model = save_tiny("llama", tmp_path)
    argv = ["faithfulness", "--model", str(model), "--device", "cpu", "--dataset", "gsm8k",
            "--samples", "2", "--rates", "0.3", "--out", str(tmp_path / "r"), "--figures", "",
            "--no-progress"]
    assert main([*argv, "--max-tokens", "1"]) == 1
    assert "the next-token loss needs at least 2" in capsys.readouterr().err
    assert not list((tmp_path / "r").glob("*.jsonl"))


def test_flags_a_run_does_not_use_get_a_note(tmp_path, capsys):
    from cwlens.cli.main import main
    from cwlens.testing import save_tiny

    model = save_tiny("llama", tmp_path)
    assert main(["faithfulness", "--model", str(model), "--device", "cpu", "--dataset", "gsm8k",
                 "--samples", "1", "--max-tokens", "8", "--rates", "0.3", "--metrics", "random",
                 "--out", str(tmp_path / "r"), "--figures", "", "--no-progress",
                 "--require-above-chance", "--prompt", "chat"]) == 0
    err = capsys.readouterr().err
    assert "--require-above-chance checks multiple-choice datasets only; gsm8k" in err
    assert "--prompt chat applies to mmlu, boolq only" in err
    assert "--non-causal" not in err and "--max-tokens" not in err
    # --non-causal on a decoder counts keys the model never reads; --max-tokens does not
    # truncate multiple-choice items: both changed or did nothing without a word
    assert main(["faithfulness", "--model", str(model), "--device", "cpu", "--dataset", "ioi",
                 "--samples", "1", "--max-tokens", "8", "--rates", "0.3", "--metrics", "random",
                 "--out", str(tmp_path / "r2"), "--figures", "", "--no-progress",
                 "--non-causal"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "--non-causal on a decoder: the future keys j > i" in err
    assert "--max-tokens truncates language-modelling documents only; ioi" in err


def test_a_run_that_masks_nothing_is_refused(tmp_path, capsys):
    """A one-token document at rate 0.3 (round_half_up(0.3 x 1) = 0) printed a table of
    exact zeros that read as "no damage"."""
    from cwlens.cli.main import main
    from cwlens.testing import save_tiny

    model = save_tiny("llama", tmp_path)
    doc = tmp_path / "one.txt"
    doc.write_text("the")
    base = ["faithfulness", "--model", str(model), "--device", "cpu", "--file", str(doc),
            "--metrics", "attention", "--figures", "", "--no-progress"]
    assert main([*base, "--rates", "0.3", "--out", str(tmp_path / "a")]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "no rate of 0.3 masks any entry: the longest scored row has 1 eligible key(s)" in err
    assert main([*base, "--rates", "0.5,1", "--protect-first-token", "--out", str(tmp_path / "b")]) == 1
    assert "has 0 eligible key(s)" in capsys.readouterr().err
    assert main([*base, "--rates", "0.5", "--out", str(tmp_path / "c")]) == 0  # one key masked
