"""The network is checked against its RASP program before anything is scored: positions
where the program has no output (RASP's None) are not compared with the argmax of float
noise, and a program whose network disagrees with it is refused, naming the input."""

import warnings

import pytest

from cwlens.cli.main import main
from cwlens.errors import CwlensWarning
from cwlens.groundtruth import library
from cwlens.groundtruth.evaluate import score_program

CATEGORICAL_MEAN = """\
from tracr.rasp import rasp
vocab = {0, 1}
max_seq_len = 3
program = rasp.categorical(rasp.Aggregate(
    rasp.Select(rasp.indices, rasp.indices, rasp.Comparison.LEQ), rasp.tokens))
"""


@pytest.mark.parametrize("name", ["prev_token", "successor", "prev_prev_token"])
def test_positions_without_an_output_are_not_mismatches(name):
    """These programs have RASP None outputs (a query with nothing to copy); the network
    writes nothing there and its argmax is noise: no input differs, no note."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", CwlensWarning)
        scores = score_program(library.load(name), n_inputs=8, n_boot=20)
    assert scores.output_mismatches == 0


def test_first_difference():
    from cwlens.groundtruth.agreement import first_difference

    assert first_difference(["BOS", "x", "a"], ["BOS", None, "a"]) is None
    assert first_difference(["BOS", "x", "a"], ["BOS", None, "b"]) == 2
    assert first_difference(["BOS", 0.5004], ["BOS", 0.5]) is None
    assert first_difference(["BOS", 0.6], ["BOS", 0.5]) == 1
    assert first_difference(["BOS", "a"], ["BOS", "a", "b"]) == 2


def test_a_network_that_disagrees_is_refused(tmp_path, capsys):
    """A categorical mean: tracr compiles it, and its network outputs one of the values
    where the program outputs their mean. Refused with one error line naming the input,
    the position and tracr's own validation."""
    pytest.importorskip("tracr")
    path = tmp_path / "mean.py"
    path.write_text(CATEGORICAL_MEAN)
    code = main(["groundtruth", "--program", str(path), "--inputs", "5", "--bootstrap", "20",
                 "--out", str(tmp_path / "o"), "--figures", "", "--no-progress"])
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cwlens: error: mean:"), err
    assert "input 0 of 5, ['BOS', 1, 0]" in err[0] and "position 2" in err[0]
    assert "Categorical aggregate does not support Selectors with width > 1" in err[0]
    assert not (tmp_path / "o" / "summary.csv").exists()
