"""``cwlens groundtruth`` end to end on a shipped program (few inputs), the ``--json`` shape,
and one clear error per bad input (unknown program, a file without ``program``, the
extras missing)."""

import json
import sys

import pandas as pd
import pytest

from cwlens.cli.main import main
from cwlens.groundtruth import library
from cwlens.groundtruth.methods import METHODS

pytestmark = pytest.mark.skipif("frac_prevs" not in library.names(),
                                reason="the shipped program frac_prevs is not built yet")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gt")
    md = out / "page.md"
    md.write_text("# page\n\n<!-- groundtruth-scores:start -->\nold\n<!-- groundtruth-scores:end -->\n")
    argv = ["groundtruth", "--program", "frac_prevs", "--inputs", "12", "--bootstrap", "200",
            "--out", str(out / "run"), "--json", str(out / "scores.json"), "--no-png",
            "--summary-md", str(md), "--no-progress"]
    assert main(argv) == 0
    return out


def test_writes_tables_figure_and_page(run):
    files = {p.name for p in (run / "run").iterdir()}
    assert {"per_input.csv.gz", "summary.csv", "tables.md", "figures"} <= files
    assert (run / "run" / "figures" / "groundtruth_auroc.html").is_file()
    summary = pd.read_csv(run / "run" / "summary.csv")
    assert set(summary["method"]) == {m.name for m in METHODS}
    per_input = pd.read_csv(run / "run" / "per_input.csv.gz")
    assert per_input["input_id"].nunique() == 12
    page = (run / "page.md").read_text()
    assert "old" not in page and "`cwlens groundtruth --program frac_prevs --inputs 12 --bootstrap 200`" in page
    assert page.count("<!-- groundtruth-scores:start -->") == 1


def test_json_shape(run):
    doc = json.loads((run / "scores.json").read_text())
    assert set(doc) == {"program", "n_inputs", "output_mismatches", "n_inputs_scored",
                        "silent_row_threshold", "methods"}
    assert doc["program"] == "frac_prevs" and doc["n_inputs"] == 12
    assert doc["output_mismatches"] == 0 and doc["silent_row_threshold"] == 1e-3
    assert list(doc["methods"]) == [m.name for m in METHODS]
    for name, entry in doc["methods"].items():
        assert set(entry) == {"level", "auroc", "ci", "precision_at_truth", "n_inputs_scored"}, name
        assert entry["level"] in ("layer", "input", "component")
        assert isinstance(entry["ci"], list) and len(entry["ci"]) == 2
        for x in (entry["auroc"], *entry["ci"], entry["precision_at_truth"]):
            assert x is None or 0.0 <= x <= 1.0


def test_json_counts_the_inputs_each_level_averaged(run):
    """n_inputs: the inputs drawn; n_inputs_scored: those with an AUROC at a level (an input
    of frac_prevs with no "x" moves nothing: no positive at the layer level)."""
    doc = json.loads((run / "scores.json").read_text())
    summary = pd.read_csv(run / "run" / "summary.csv")
    main_scope = summary[summary["scope"] == "main"]
    for level in ("layer", "input", "component"):
        n = int(main_scope[main_scope["level"] == level]["n"].max())
        assert doc["n_inputs_scored"][level] == n
        for entry in doc["methods"].values():
            if entry["level"] == level:
                assert entry["n_inputs_scored"] == n
    assert doc["n_inputs_scored"]["layer"] < doc["n_inputs"]


def test_help_lists_the_shipped_programs_and_the_silent_rows(capsys):
    with pytest.raises(SystemExit):
        main(["groundtruth", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"shipped programs: {', '.join(library.names())}" in text
    assert "at most 1e-3 of the layer's largest projected value norm" in text
    assert "silent_row_threshold" in text and "n_inputs_scored" in text
    from cwlens.groundtruth.compiler import MAX_SEQ_LEN

    assert f"max_seq_len is at most {MAX_SEQ_LEN}" in text


def test_unknown_program_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as err:
        main(["groundtruth", "--program", "frac_prev"])
    assert err.value.code == 2
    message = capsys.readouterr().err
    assert "unknown program 'frac_prev'" in message and "frac_prevs" in message


def test_file_without_program(tmp_path, capsys):
    pytest.importorskip("tracr")
    path = tmp_path / "mine.py"
    path.write_text("vocab = {'a', 'b'}\nmax_seq_len = 4\n")
    assert main(["groundtruth", "--program", str(path), "--out", str(tmp_path / "o")]) == 1
    message = capsys.readouterr().err
    assert "defines no program" in message and "mine.py" in message
    assert len(message.strip().splitlines()) == 1


def test_missing_tracr_extra(tmp_path, capsys, monkeypatch):
    path = tmp_path / "mine.py"
    path.write_text("from tracr.compiler import lib\nprogram = lib.make_hist()\n")
    for name in ("tracr", "tracr.compiler", "tracr.compiler.compiling", "tracr.rasp"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    assert main(["groundtruth", "--program", str(path), "--out", str(tmp_path / "o")]) == 1
    message = capsys.readouterr().err
    assert "cwlens[tracr]" in message and "mine.py" in message


def test_missing_captum(tmp_path, capsys, monkeypatch):
    for name in ("captum", "captum.attr"):
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["groundtruth", "--program", "frac_prevs", "--out", str(tmp_path / "o")]) == 1
    message = capsys.readouterr().err
    assert "captum" in message and "cwlens[groundtruth]" in message
    assert not (tmp_path / "o").exists()  # refused before anything ran


def test_too_few_inputs(capsys):
    with pytest.raises(SystemExit) as err:
        main(["groundtruth", "--inputs", "2"])
    assert err.value.code == 2
    assert "at least 3" in capsys.readouterr().err


def test_silent_row_threshold_is_checked(capsys):
    with pytest.raises(SystemExit) as err:
        main(["groundtruth", "--program", "frac_prevs", "--silent-row-threshold", "2"])
    assert err.value.code == 2
    assert "must be a number in [0, 1)" in capsys.readouterr().err
