"""A CLI command is a request object (issue 49): the parsed command line is resolved and
checked once into a frozen request, and the argparse Namespace stays as it was parsed."""

import dataclasses

import pytest

from cwlens.cli.faithfulness_request import FaithfulnessRequest
from cwlens.cli.main import build_parser
from cwlens.errors import InvalidArgumentError
from cwlens.faithfulness.results import ResultsWriter


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
