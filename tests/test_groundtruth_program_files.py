"""A program file that cannot be run or compiled is one ``error:`` line naming the user's
file, its line and the message (never a traceback through a temporary copy), and a
``max_seq_len`` beyond what compiles in reasonable memory is refused before tracr runs."""

import pytest

from cwlens.cli.main import main
from cwlens.errors import InvalidArgumentError
from cwlens.groundtruth import library

pytest.importorskip("tracr")

HEADER = "from tracr.compiler import lib\nfrom tracr.rasp import rasp\n"


def _error_line(tmp_path, capsys, body: str) -> tuple[str, str]:
    path = tmp_path / "mine.py"
    path.write_text(HEADER + body)
    code = main(["groundtruth", "--program", str(path), "--out", str(tmp_path / "o"),
                 "--figures", "", "--no-progress"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 1, lines
    assert lines[0].startswith(f"cwlens: error: {path}, line ")
    assert "program.py" not in lines[0] and "Traceback" not in lines[0]
    return lines[0], str(path)


@pytest.mark.parametrize(("body", "line", "words"), [
    ("vocab = {'a', 'b'}\nmax_seq_len = 4\nprogram = lib.make_hist(\n", 5, "SyntaxError"),
    ("vocab = {'a', 'b'}\nmax_seq_len = 4 / 0\nprogram = lib.make_hist()\n", 4,
     "ZeroDivisionError: division by zero"),
    ("vocab = {['a'], ['b']}\nmax_seq_len = 4\nprogram = lib.make_hist()\n", 3,
     "TypeError: unhashable type: 'list'"),
    ("vocab = [['a'], ['b']]\nmax_seq_len = 4\nprogram = lib.make_hist()\n", 3,
     "vocab holds ['a'], a list, which is unhashable"),
])
def test_a_broken_file_is_one_line_naming_it(tmp_path, capsys, body, line, words):
    message, path = _error_line(tmp_path, capsys, body)
    assert f"{path}, line {line}: " in message and words in message, message


def test_a_raising_function_names_its_line(tmp_path, capsys):
    body = ("def helper():\n    return {}['missing']\n\nvocab = {'a'}\nmax_seq_len = 3\n"
            "value = helper()\nprogram = lib.make_hist()\n")
    message, path = _error_line(tmp_path, capsys, body)
    assert f"{path}, line 4: KeyError" in message  # the line inside helper, in the user's file


def test_a_program_that_fails_on_an_input_names_it(tmp_path, capsys):
    """A mean of string tokens compiles but tracr's evaluator raises on every input."""
    path = tmp_path / "mean.py"
    path.write_text(HEADER + "vocab = {'a', 'b'}\nmax_seq_len = 3\nprogram = rasp.categorical("
                    "rasp.Aggregate(rasp.Select(rasp.indices, rasp.indices, rasp.Comparison.LEQ), "
                    "rasp.tokens))\n")
    code = main(["groundtruth", "--program", str(path), "--inputs", "4", "--out",
                 str(tmp_path / "o"), "--figures", "", "--no-progress"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(lines) == 1, lines
    assert "the RASP program fails on the input ['BOS', " in lines[0]
    assert "ValueError: Only types int, bool, and float are supported" in lines[0]


def test_a_huge_max_seq_len_is_refused_before_compiling(tmp_path, capsys):
    message, path = _error_line(
        tmp_path, capsys, "vocab = {'a', 'b'}\nmax_seq_len = 10**9\nprogram = lib.make_hist()\n")
    assert f"{path}, line 4: max_seq_len 1000000000 is beyond" in message
    from cwlens.groundtruth.compiler import MAX_SEQ_LEN

    assert f"max_seq_len <= {MAX_SEQ_LEN}" in message
    with pytest.raises(InvalidArgumentError, match=f"max_seq_len <= {MAX_SEQ_LEN}"):
        from tracr.compiler import lib

        from cwlens.groundtruth.compiler import compile_program
        compile_program(lib.make_hist(), {"a"}, MAX_SEQ_LEN + 1)


def test_the_limit_itself_is_accepted(tmp_path):
    from cwlens.groundtruth.compiler import MAX_SEQ_LEN

    path = tmp_path / "mine.py"
    path.write_text(HEADER + f"vocab = {{'a', 'b'}}\nmax_seq_len = {MAX_SEQ_LEN}\n"
                    "program = rasp.Map(lambda x: x, rasp.tokens)\n")
    assert library.read_file(path)["max_seq_len"] == MAX_SEQ_LEN
