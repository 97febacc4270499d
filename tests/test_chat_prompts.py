"""Chat prompts (cwlens.datasets.chat_prompts): the exact user turns, the answers read as
the assistant's first token, golds equal to the plain items', refusals naming the fix,
the model's chat template through the handle, and ``cwlens accuracy --prompt chat``."""

import json

import pytest

from cwlens.datasets import CHAT_DATASETS, DATA_DIR, load_dataset
from cwlens.engine.handle import wrap
from cwlens.errors import CwlensError, InvalidArgumentError, UnsupportedModelError
from cwlens.testing import save_tiny, tiny_model

TEMPLATE = ("{% for m in messages %}<bos> {{ m['content'] }} <eos>{% endfor %}"
            "{% if add_generation_prompt %} assistant\n{% endif %}")


def fake_chat(user: str) -> str:
    return f"<user>{user}</user>\n<assistant>\n"


def test_mmlu_chat_item_is_the_user_turn_written_out():
    item = load_dataset("mmlu", n=1, chat=fake_chat)[0]
    user = ("The following is a multiple choice question about abstract algebra.\n\n"
            "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18)) over Q.\n"
            "A. 0\nB. 4\nC. 2\nD. 6\n\n"
            "Answer with the letter of the correct option (A, B, C or D).")
    assert item.contexts == (fake_chat(user),) * 4
    assert item.continuations == ("A", "B", "C", "D")
    assert (item.id, item.gold, item.dataset) == ("mmlu-0000", 1, "mmlu")


def test_boolq_chat_item_is_the_user_turn_written_out():
    row = json.loads((DATA_DIR / "boolq.jsonl").read_text().splitlines()[0])
    item = load_dataset("boolq", n=1, chat=fake_chat)[0]
    user = f"{row['passage']}\n\nQuestion: {row['question']}?\n\nAnswer with Yes or No."
    assert item.contexts == (fake_chat(user), fake_chat(user))
    assert item.continuations == ("No", "Yes")
    assert item.gold == int(row["answer"])


@pytest.mark.parametrize("name", CHAT_DATASETS)
def test_chat_items_keep_the_plain_items_ids_and_golds(name):
    plain, chat = load_dataset(name), load_dataset(name, chat=fake_chat)
    assert [(i.id, i.gold) for i in chat] == [(i.id, i.gold) for i in plain]
    assert len(chat) == len(plain) == 500


@pytest.mark.parametrize("name", ["winogrande", "ioi", "capitals", "gsm8k"])
def test_datasets_without_a_chat_form_refuse(name):
    with pytest.raises(InvalidArgumentError, match=rf"{name} has no chat form.*--prompt plain"):
        load_dataset(name, n=2, chat=fake_chat)


def test_chat_is_zero_shot_and_a_function():
    with pytest.raises(InvalidArgumentError, match="num_fewshot=2"):
        load_dataset("mmlu", n=2, chat=fake_chat, num_fewshot=2)
    with pytest.raises(CwlensError, match="chat must be a function"):
        load_dataset("boolq", n=2, chat="chatml")  # type: ignore[arg-type]


def test_the_handle_applies_the_tokenizer_template():

    model = tiny_model("llama")
    with pytest.raises(UnsupportedModelError, match="no chat template.*--prompt plain"):
        wrap(model).chat_prompt("one two")
    model.tokenizer.chat_template = TEMPLATE
    assert wrap(model).chat_prompt("one two") == "<bos> one two <eos> assistant\n"


def test_accuracy_command_prompt_chat(tmp_path, capsys):
    from transformers import AutoTokenizer

    import cwlens
    from cwlens.cli.main import main
    from cwlens.faithfulness.accuracy import clean_accuracy

    model_dir = save_tiny("llama", tmp_path)
    base = ["accuracy", "--model", str(model_dir), "--device", "cpu", "--dataset", "mmlu,ioi",
            "--samples", "mmlu=4,ioi=6", "--prompt", "chat"]
    assert main(base) == 1  # the tiny tokenizer has no chat template
    assert "no chat template" in capsys.readouterr().err
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(model_dir)
    md = tmp_path / "acc.md"
    assert main(base + ["--summary-md", str(md)]) == 0
    out = capsys.readouterr().out
    model = cwlens.load_model(str(model_dir), device="cpu")
    chat = load_dataset("mmlu", 4, chat=cwlens.wrap(model).chat_prompt)  # boolq: past n_ctx 128
    assert chat[0].contexts[0].startswith("<bos> ") and chat[0].contexts[0].endswith(" assistant\n")
    assert clean_accuracy(model, chat).line() in out
    assert clean_accuracy(model, load_dataset("ioi", 6)).line() in out
    text = md.read_text()
    assert "| dataset | prompt | n |" in text
    assert "| mmlu | chat | 4 |" in text and "| ioi | plain | 6 |" in text


def test_faithfulness_command_prompt_chat(tmp_path, capsys):
    """``cwlens faithfulness --prompt chat`` masks the chat items (their own results file,
    so a plain run in the same folder is never taken for it) and refuses exemplars."""
    import pandas as pd
    from transformers import AutoTokenizer

    import cwlens
    from cwlens.cli.main import main
    from cwlens.faithfulness.accuracy import item_accuracies

    model_dir = save_tiny("llama", tmp_path)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(model_dir)
    out = tmp_path / "runs"
    base = ["faithfulness", "--model", str(model_dir), "--device", "cpu", "--dataset", "mmlu",
            "--samples", "3", "--metrics", "contribution,random", "--rates", "0.5",
            "--figures", "", "--no-progress", "--out", str(out)]
    assert main(base + ["--prompt", "chat", "--num-fewshot", "2"]) == 1
    assert "--prompt chat is zero-shot" in capsys.readouterr().err
    assert main(base + ["--prompt", "chat"]) == 0
    assert main(base) == 0  # plain: its own file
    assert sorted(p.name for p in out.glob("*.jsonl")) == ["mmlu.jsonl", "mmlu_chat.jsonl"]
    model = cwlens.load_model(str(model_dir), device="cpu")
    chat = load_dataset("mmlu", 3, chat=cwlens.wrap(model).chat_prompt)
    for name, items in (("mmlu_chat", chat), ("mmlu", load_dataset("mmlu", 3))):
        rows = pd.read_json(out / f"{name}.jsonl", lines=True)
        clean = rows[(rows["mode"] == "clean") & (rows["measure"] == "acc")]
        assert dict(zip(clean.sample_id, clean.value, strict=True)) == {
            i.id: a for i, a in zip(items, item_accuracies(wrap(model), items), strict=True)}
    assert chat[0].contexts[0] != load_dataset("mmlu", 1)[0].contexts[0]
