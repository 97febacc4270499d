"""Tests for cwlens.datasets: shipped samples, lm-eval formats, errors, sources."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from cwlens.datasets import (
    DATA_DIR,
    DATASET_NAMES,
    SHIPPED_FILES,
    ChoiceItem,
    DatasetFormatError,
    DatasetSourceError,
    TextSample,
    UnknownDatasetError,
    available_datasets,
    load_dataset,
)
from cwlens.errors import CwlensError, UnknownOptionError

REPO = Path(__file__).resolve().parents[1]
EXPECTED_COUNTS = {
    "gsm8k": 500,
    "fineweb_edu": 150,
    "fineweb_edu_substitute_wikipedia": 350,
    "mmlu": 500,
    "winogrande": 500,
    "boolq": 500,
    "ioi": 300,  # the circuit tasks as choice items (issue 17, point 7a)
    "induction": 300,
    "capitals": 207,
}
TEXT = ("gsm8k", "fineweb_edu", "fineweb_edu_substitute_wikipedia")
CHOICE = ("mmlu", "winogrande", "boolq", "ioi", "induction", "capitals")


def raw_rows(filename: str) -> list[dict]:
    return [json.loads(line) for line in (DATA_DIR / filename).read_text("utf-8").splitlines()]


# --- shipped files --------------------------------------------------------


def test_shipped_files_sha256_match_table():
    assert sorted(SHIPPED_FILES) == sorted(p.name for p in DATA_DIR.glob("*.jsonl"))
    for filename, digest in SHIPPED_FILES.items():
        assert hashlib.sha256((DATA_DIR / filename).read_bytes()).hexdigest() == digest, filename


def test_sources_md_table_agrees_with_code():
    text = (DATA_DIR / "SOURCES.md").read_text("utf-8")
    table = dict(re.findall(r"^\| (\S+\.jsonl) \| \d+ \| \d+ \| ([0-9a-f]{64}) \|", text, re.M))
    assert table == SHIPPED_FILES
    for name in ("MIT", "CC-BY", "CC BY-SA 3.0", "ODC-By 1.0"):
        assert name in text


def test_available_datasets():
    infos = {info.name: info for info in available_datasets()}
    assert tuple(infos) == DATASET_NAMES
    assert {n: i.rows for n, i in infos.items()} == EXPECTED_COUNTS
    assert {n for n, i in infos.items() if i.kind == "text"} == set(TEXT)
    assert {n for n, i in infos.items() if i.kind == "choice"} == set(CHOICE)
    for info in infos.values():
        assert info.rows == len(raw_rows(f"{info.name}.jsonl"))


# --- every loader on the shipped samples ----------------------------------


@pytest.mark.parametrize("name", DATASET_NAMES)
def test_counts_ids_and_types(name):
    records = load_dataset(name)
    assert len(records) == EXPECTED_COUNTS[name]
    assert [r.id for r in records] == [f"{name}-{i:04d}" for i in range(len(records))]
    assert all(r.dataset == name for r in records)
    kind = TextSample if name in TEXT else ChoiceItem
    assert all(type(r) is kind for r in records)
    with pytest.raises(AttributeError):  # frozen
        records[0].id = "x"


@pytest.mark.parametrize("name", CHOICE)
def test_choice_items_well_formed(name):
    for item in load_dataset(name):
        assert len(item.contexts) == len(item.continuations) == item.num_choices
        assert 0 <= item.gold < item.num_choices
        assert all(c.startswith(" ") for c in item.continuations)
        assert item.pairs == tuple(zip(item.contexts, item.continuations, strict=True))


def test_n_takes_first_rows_and_seed_is_deterministic():
    full = load_dataset("gsm8k")
    assert load_dataset("gsm8k", n=7) == full[:7]
    assert load_dataset("gsm8k", n=0) == []
    a = load_dataset("gsm8k", n=20, seed=3)
    assert a == load_dataset("gsm8k", n=20, seed=3)
    assert a != full[:20] and set(a) <= set(full)  # ids stay those of the source rows
    with pytest.raises(ValueError, match="only 500 rows"):
        load_dataset("gsm8k", n=501)
    with pytest.raises(ValueError, match="n must be"):
        load_dataset("gsm8k", n=-1)


def test_gsm8k_text_format():
    rows = raw_rows("gsm8k.jsonl")
    samples = load_dataset("gsm8k")
    for row, sample in zip(rows, samples, strict=True):
        assert sample.text == f"Question: {row['question']}\nAnswer: {row['answer']}"
    assert samples[0].text.startswith("Question: Janet’s ducks lay 16 eggs per day.")
    assert samples[0].text.endswith("\n#### 18")


@pytest.mark.parametrize("name", ["fineweb_edu", "fineweb_edu_substitute_wikipedia"])
def test_documents_verbatim(name):
    rows = raw_rows(f"{name}.jsonl")
    assert [s.text for s in load_dataset(name)] == [r["text"] for r in rows]


def test_first_mmlu_item_zero_shot_literal():
    item = load_dataset("mmlu", n=1)[0]
    expected = (
        "The following are multiple choice questions (with answers) about abstract algebra.\n\n"
        "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\n"
        "A. 0\nB. 4\nC. 2\nD. 6\nAnswer:"
    )
    assert item.contexts == (expected,) * 4
    assert item.continuations == (" A", " B", " C", " D")
    assert item.gold == 1


def test_mmlu_subject_spaces_and_gold():
    rows = raw_rows("mmlu.jsonl")
    for row, item in zip(rows, load_dataset("mmlu"), strict=True):
        subject = row["subject"].replace("_", " ")
        assert item.contexts[0].startswith(
            f"The following are multiple choice questions (with answers) about {subject}.\n\n"
        )
        assert "_" not in item.contexts[0].split("\n")[0]
        assert item.gold == row["answer"]
        assert item.contexts[0].endswith("\nD. " + row["choices"][3] + "\nAnswer:")


def test_mmlu_five_shot_uses_first_same_subject_dev_exemplars():
    rows = raw_rows("mmlu.jsonl")
    dev = raw_rows("mmlu_dev.jsonl")
    letters = "ABCD"
    zero_shot = load_dataset("mmlu")
    for row, item, plain in zip(rows, load_dataset("mmlu", num_fewshot=5), zero_shot, strict=True):
        same = [d for d in dev if d["subject"] == row["subject"]][:5]
        assert len(same) == 5
        shots = "".join(
            f"{d['question'].strip()}\n"
            + "".join(f"{letters[j]}. {c}\n" for j, c in enumerate(d["choices"]))
            + f"Answer: {letters[d['answer']]}\n\n"
            for d in same
        )
        header = (
            "The following are multiple choice questions (with answers) about "
            f"{row['subject'].replace('_', ' ')}.\n\n"
        )
        ctx = item.contexts[0]
        assert item.contexts == (ctx,) * 4
        assert ctx == header + shots + plain.contexts[0][len(header) :]
        assert ctx.count("\nAnswer:") == 6
        # no exemplar from another subject leaks in
        others = [d for d in dev if d["subject"] != row["subject"] and len(d["question"]) > 40]
        assert not any(d["question"].strip() + "\n" in ctx for d in others)


def test_mmlu_fewshot_bounds():
    assert load_dataset("mmlu", n=1, num_fewshot=2)[0].contexts[0].count("\nAnswer:") == 3
    with pytest.raises(ValueError, match="0-5"):
        load_dataset("mmlu", num_fewshot=6)
    with pytest.raises(ValueError, match="only supported for mmlu"):
        load_dataset("boolq", num_fewshot=1)


def test_winogrande_partial_evaluation_split():
    rows = raw_rows("winogrande.jsonl")
    items = load_dataset("winogrande")
    first = items[0]
    assert first.contexts == (
        "Sarah was a much better surgeon than Maria so Sarah",
        "Sarah was a much better surgeon than Maria so Maria",
    )
    assert first.continuations == (" always got the easier cases.",) * 2
    assert first.gold == 1  # answer "2"
    for row, item in zip(rows, items, strict=True):
        before, after = row["sentence"].split("_")
        assert item.contexts == (before + row["option1"], before + row["option2"])
        assert item.continuations == (" " + after.strip(),) * 2
        assert item.gold == {"1": 0, "2": 1}[row["answer"]]
        # context + continuation is the filled-in sentence, up to the whitespace that
        # lm-eval strips after the blank (some sentences have "_  word")
        for ctx, option in zip(item.contexts, (row["option1"], row["option2"]), strict=True):
            filled = row["sentence"].replace("_", option)
            assert (ctx + item.continuations[0]).split() == filled.split()


def test_boolq_format_and_gold():
    rows = raw_rows("boolq.jsonl")
    items = load_dataset("boolq")
    for row, item in zip(rows, items, strict=True):
        ctx = f"{row['passage']}\nQuestion: {row['question']}?\nAnswer:"
        assert item.contexts == (ctx, ctx)
        assert item.continuations == (" no", " yes")
        assert item.gold == (1 if row["answer"] else 0)
    assert sum(item.gold for item in items) == 315  # 315 true / 185 false


# --- path= and errors -----------------------------------------------------


def write(tmp_path: Path, lines: list[str], name: str = "data.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_path_loading(tmp_path):
    rows = [
        {"question": "Is it?", "passage": "It is.", "answer": True},
        {"question": "Is it not", "passage": "P", "answer": False, "extra": 1},
    ]
    path = write(tmp_path, [json.dumps(r) for r in rows[:1]] + [""] + [json.dumps(rows[1])])
    items = load_dataset("boolq", path=path)
    assert [i.id for i in items] == ["boolq-0000", "boolq-0001"]
    assert items[0].contexts[0] == "It is.\nQuestion: Is it??\nAnswer:"
    assert [i.gold for i in items] == [1, 0]
    # a copy of a shipped file loads identically; mmlu few-shot uses the shipped dev split
    copy = tmp_path / "mmlu_copy.jsonl"
    copy.write_bytes((DATA_DIR / "mmlu.jsonl").read_bytes())
    assert load_dataset("mmlu", 3, path=str(copy), num_fewshot=5) == load_dataset(
        "mmlu", 3, num_fewshot=5
    )


def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_dataset("gsm8k", path=tmp_path / "nope.jsonl")


GOOD_GSM = json.dumps({"question": "q", "answer": "a"})


@pytest.mark.parametrize(
    "name, bad_line, problem",
    [
        ("gsm8k", '{"question": "q", "answer": ', "invalid JSON"),
        ("gsm8k", '{"question": "q"}', 'missing field "answer"'),
        ("gsm8k", '{"question": 3, "answer": "a"}', 'field "question" must be str, got 3 (int)'),
        ("gsm8k", '["q", "a"]', "expected a JSON object, got list"),
        (
            "mmlu",
            '{"question": "q", "choices": ["a", "b", "c"], "answer": 0, "subject": "s"}',
            'field "choices" must be list of 4 str',
        ),
        (
            "mmlu",
            '{"question": "q", "choices": ["a", "b", "c", "d"], "answer": "B", "subject": "s"}',
            'field "answer" must be int 0-3, got "B" (str)',
        ),
        (
            "mmlu",
            '{"question": "q", "choices": ["a", "b", "c", "d"], "answer": true, "subject": "s"}',
            'field "answer" must be int 0-3, got true (bool)',
        ),
        (
            "winogrande",
            '{"sentence": "no blank", "option1": "a", "option2": "b", "answer": "1"}',
            'field "sentence" must be str containing "_"',
        ),
        (
            "winogrande",
            '{"sentence": "a _ b", "option1": "a", "option2": "b", "answer": 1}',
            'field "answer" must be str "1" or "2", got 1 (int)',
        ),
        (
            "boolq",
            '{"question": "q", "passage": "p", "answer": "yes"}',
            'field "answer" must be bool, got "yes" (str)',
        ),
        ("fineweb_edu", '{"txt": "doc"}', 'missing field "text"'),
    ],
)
def test_malformed_line_reports_file_line_problem_schema(tmp_path, name, bad_line, problem):
    good = {
        "gsm8k": GOOD_GSM,
        "mmlu": json.dumps({"question": "q", "choices": list("abcd"), "answer": 0, "subject": "s"}),
        "winogrande": json.dumps(
            {"sentence": "a _ b", "option1": "x", "option2": "y", "answer": "2"}
        ),
        "boolq": json.dumps({"question": "q", "passage": "p", "answer": False}),
        "fineweb_edu": json.dumps({"text": "doc"}),
    }[name]
    path = write(tmp_path, [good, "", good, bad_line, good])  # blank line still counts
    with pytest.raises(DatasetFormatError) as info:
        load_dataset(name, path=path)
    message = str(info.value)
    assert message.startswith(f"{path}, line 4: {problem}")
    assert "Expected one JSON object per line with schema {" in message
    assert isinstance(info.value, ValueError) and isinstance(info.value, CwlensError)


def test_schema_named_in_message(tmp_path):
    path = write(tmp_path, ['{"question": "q"}'])
    with pytest.raises(DatasetFormatError, match=re.escape('{"question": str, "answer": str}')):
        load_dataset("gsm8k", path=path)


def test_invalid_utf8_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(GOOD_GSM.encode() + b"\n" + b'{"question": "\xff", "answer": "a"}\n')
    with pytest.raises(DatasetFormatError, match=re.escape(f"{path}, line 2: not valid UTF-8")):
        load_dataset("gsm8k", path=path)


def test_unknown_name_lists_valid_names():
    with pytest.raises(UnknownDatasetError) as info:
        load_dataset("hellaswag")
    assert isinstance(info.value, UnknownOptionError) and isinstance(info.value, ValueError)
    message = str(info.value)
    assert "'hellaswag'" in message
    for name in DATASET_NAMES:
        assert name in message
    with pytest.raises(ValueError, match="source must be"):
        load_dataset("gsm8k", source="web")


# --- source="hf" (offline: fake or missing `datasets`) ---------------------


def test_hf_without_datasets_library(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(DatasetSourceError, match='not installed.*source="shipped".*path=') as info:
        load_dataset("gsm8k", source="hf")
    assert isinstance(info.value, CwlensError)


def fake_datasets(monkeypatch, tables=None, error=None):
    calls = []

    def load(path, config=None, *, split, streaming=False):
        calls.append((path, config, split, streaming))
        if error is not None:
            raise error
        rows = tables[(path, split)]
        return iter(rows) if streaming else list(rows)

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load))
    return calls


def test_hf_unreachable(monkeypatch):
    fake_datasets(monkeypatch, error=ConnectionError("no route to huggingface.co"))
    with pytest.raises(DatasetSourceError) as info:
        load_dataset("boolq", source="hf")
    message = str(info.value)
    assert "hf://google/boolq (validation)" in message and "no route" in message
    assert 'source="shipped"' in message and "path=" in message


def test_hf_schema_mapping(monkeypatch):
    mmlu = raw_rows("mmlu.jsonl")[:3]
    dev = raw_rows("mmlu_dev.jsonl")
    tables = {
        ("openai/gsm8k", "test"): [{"question": "q", "answer": "a"}],
        ("HuggingFaceFW/fineweb-edu", "train"): ({"text": f"d{i}", "id": i} for i in range(10**6)),
        ("cais/mmlu", "test"): mmlu,
        ("cais/mmlu", "dev"): dev,
        ("allenai/winogrande", "validation"): raw_rows("winogrande.jsonl")[:2],
        ("google/boolq", "validation"): [{"question": "q", "answer": True, "passage": "p"}],
    }
    calls = fake_datasets(monkeypatch, tables)
    assert load_dataset("gsm8k", source="hf")[0].text == "Question: q\nAnswer: a"
    docs = load_dataset("fineweb_edu", n=3, source="hf")
    assert [d.text for d in docs] == ["d0", "d1", "d2"]
    assert load_dataset("mmlu", source="hf", num_fewshot=5) == load_dataset(
        "mmlu", 3, num_fewshot=5
    )
    assert load_dataset("winogrande", source="hf") == load_dataset("winogrande", 2)
    assert load_dataset("boolq", source="hf")[0].gold == 1
    assert ("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", True) in calls
    assert ("allenai/winogrande", "winogrande_xl", "validation", False) in calls
    assert ("openai/gsm8k", "main", "test", False) in calls
    with pytest.raises(ValueError, match="pass n="):
        load_dataset("fineweb_edu", source="hf")
    with pytest.raises(ValueError, match="no hub source"):
        load_dataset("fineweb_edu_substitute_wikipedia", source="hf")


def test_hf_rows_are_validated(monkeypatch):
    fake_datasets(monkeypatch, {("openai/gsm8k", "test"): [{"question": "q"}]})
    with pytest.raises(
        DatasetFormatError, match=r"hf://openai/gsm8k \(main, test\), line 1: missing"
    ):
        load_dataset("gsm8k", source="hf")


# --- import hygiene ---------------------------------------------------------


def test_import_does_not_pull_torch_or_hf_datasets():
    code = (
        "import sys, cwlens.datasets as d; d.load_dataset('mmlu', 2, num_fewshot=5); "
        "print('torch' in sys.modules, 'datasets' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "False"]
