"""A CLI command is a request object (issue 49): the parsed command line is resolved and
checked once into a frozen request, and no command writes into the argparse Namespace."""

import ast
import dataclasses
from pathlib import Path

import pytest

import cwlens
from cwlens.cli.faithfulness_request import FaithfulnessRequest
from cwlens.cli.main import build_parser
from cwlens.errors import InvalidArgumentError
from cwlens.faithfulness.results import ResultsWriter

CLI = Path(cwlens.__file__).parent / "cli"


def _parse(*argv: str):
    return build_parser().parse_args(["faithfulness", *argv])


def test_the_request_resolves_everything_and_leaves_the_flags_as_given(tmp_path):
    args = _parse("--dataset", "capitals", "--samples", "8", "--out", str(tmp_path / "r"))
    before = dict(vars(args))
    request = FaithfulnessRequest.from_flags(args)
    assert vars(args) == before
    assert request.flags is args and request.datasets == ("capitals",)
    assert request.counts == {"capitals": 8} and request.samples_given
    assert request.figures == str(tmp_path / "r" / "figures")
    assert request.paths == (tmp_path / "r" / "capitals.jsonl",) and request.file_samples == ()


def test_a_file_request_holds_its_one_document_and_the_flags_keep_their_defaults(tmp_path):
    text = tmp_path / "my story.txt"
    text.write_text("Once upon a time there was a text.", encoding="utf-8")
    args = _parse("--file", str(text), "--out", str(tmp_path / "r"), "--figures", "")
    before = dict(vars(args))
    request = FaithfulnessRequest.from_flags(args)
    assert vars(args) == before  # --dataset and --samples as parsed: gsm8k, None
    assert request.datasets == ("file_my_story",) and request.counts == {"file_my_story": 1}
    assert not request.samples_given and request.figures == ""
    assert [s.dataset for s in request.file_samples] == ["file_my_story"]


def test_the_request_is_frozen(tmp_path):
    request = FaithfulnessRequest.from_flags(
        _parse("--dataset", "capitals", "--samples", "4", "--out", str(tmp_path / "r")))
    for field in dataclasses.fields(request):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(request, field.name, None)


def test_a_bad_combination_is_refused_while_building_the_request(tmp_path):
    args = _parse("--dataset", "gsm8k", "--num-fewshot", "2", "--out", str(tmp_path / "r"))
    with pytest.raises(InvalidArgumentError, match="--num-fewshot applies to mmlu only"):
        FaithfulnessRequest.from_flags(args)


def test_report_only_runs_from_the_request_and_leaves_the_namespace_unchanged(tmp_path, capsys):
    out = tmp_path / "r"
    w = ResultsWriter(out / "gsm8k.jsonl", {"samples": ["a", "b"], "metrics": ["attention"]},
                      rows_per_sample=1)
    for sid, v in (("a", 1.0), ("b", 3.0)):
        w.write_sample([{"model": "m", "dataset": "gsm8k", "metric": "attention",
                         "mode": "comprehensiveness", "rate": 0.1, "scope": "row", "layers": "all",
                         "sample_id": sid, "measure": "delta_ppl", "value": v}])
    args = _parse("--out", str(out), "--report-only", "--figures", "", "--samples", "2")
    before = dict(vars(args))
    assert args.func(args) == 0
    assert vars(args) == before
    assert "attention" in capsys.readouterr().out


def _writes_into_args(path: Path) -> list[str]:
    """``args.x = ...``, ``args.x += ...``, ``setattr(args, ...)`` and ``vars(args)[...] =``
    in one module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AugAssign | ast.AnnAssign) else [])
        for t in targets:
            base = t.value if isinstance(t, ast.Attribute | ast.Subscript) else None
            if isinstance(base, ast.Call) and getattr(base.func, "id", None) == "vars":
                base = base.args[0] if base.args else None
            if isinstance(base, ast.Name) and base.id == "args":
                found.append(f"{path.name}:{node.lineno}")
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr"
                and node.args and getattr(node.args[0], "id", None) == "args"):
            found.append(f"{path.name}:{node.lineno}")
    return found


def test_no_command_writes_into_its_parsed_flags():
    found = [hit for path in sorted(CLI.glob("*.py")) for hit in _writes_into_args(path)]
    assert found == [], "resolve into a local value or a frozen request instead:\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_write(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("args.a = 1\nargs.b += 1\nsetattr(args, 'c', 1)\nvars(args)['d'] = 1\n"
                    "x.a = args.a\n")
    assert sorted(_writes_into_args(path)) == ["m.py:1", "m.py:2", "m.py:3", "m.py:4"]
