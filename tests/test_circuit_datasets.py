"""The circuit tasks as choice datasets (cwlens.datasets.circuit_tasks)."""

import json
import re

import pytest

from cwlens.datasets import DATA_DIR, DatasetFormatError, load_dataset
from cwlens.datasets import circuit_tasks as ct


@pytest.mark.parametrize("task", ct.TASK_NAMES)
def test_generator_reproduces_the_shipped_bytes(task):
    assert (DATA_DIR / f"{task}.jsonl").read_text("utf-8") == ct.jsonl_text(task)


@pytest.mark.parametrize("task", ct.TASK_NAMES)
def test_at_least_200_items_gold_shuffled(task):
    items = load_dataset(task)
    assert len(items) >= 200
    k = {"ioi": 2, "induction": 4, "capitals": 4}[task]
    assert {i.num_choices for i in items} == {k}
    counts = [sum(i.gold == g for i in items) for g in range(k)]
    assert min(counts) > len(items) / k / 2  # every position holds the gold often
    assert all(len(set(i.contexts)) == 1 for i in items)


def test_ioi_gold_is_the_indirect_object():
    for item in load_dataset("ioi"):
        context = item.contexts[0]
        names = [c.strip() for c in item.continuations]
        gold, other = names[item.gold], names[1 - item.gold]
        assert len(re.findall(rf"\b{gold}\b", context)) == 1  # IO: named once
        assert len(re.findall(rf"\b{other}\b", context)) == 2  # S: named twice
        assert context.endswith(" to")


def test_induction_gold_is_the_next_word_of_the_sequence():
    for item in load_dataset("induction"):
        words = item.contexts[0].split()
        first = words[: ct.INDUCTION_LENGTH]
        assert len(set(first)) == ct.INDUCTION_LENGTH
        second = words[ct.INDUCTION_LENGTH:]
        assert second == first[: len(second)] and 2 <= len(second) < ct.INDUCTION_LENGTH
        choices = [c.strip() for c in item.continuations]
        assert choices[item.gold] == first[len(second)]
        assert set(choices) <= set(first)


def test_capitals_gold_is_the_capital_of_the_place():
    capital_of = {p: c for group in ct.CAPITAL_GROUPS for p, c in group}
    items = load_dataset("capitals")
    assert len(items) == sum(not ct.copies_name(p, c) for p, c in capital_of.items())
    for item in items:
        place = item.contexts[0].removeprefix("The capital of ").removesuffix(" is")
        choices = [c.strip() for c in item.continuations]
        assert choices[item.gold] == capital_of[place]
        assert not ct.copies_name(place, capital_of[place])
    assert ct.copies_name("Algeria", "Algiers") and not ct.copies_name("France", "Paris")


def test_answer_out_of_range_is_refused(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"context": "x", "choices": ["a", "b"], "answer": 2}) + "\n")
    with pytest.raises(DatasetFormatError, match="answer=2 but there are only 2 choices"):
        load_dataset("ioi", path=path)
    path.write_text(json.dumps({"context": "x", "choices": ["a", "a"], "answer": 0}) + "\n")
    with pytest.raises(DatasetFormatError, match="distinct"):
        load_dataset("ioi", path=path)


def test_no_hub_source():
    with pytest.raises(ValueError, match="no hub source"):
        load_dataset("capitals", source="hf")
