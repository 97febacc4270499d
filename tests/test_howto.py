"""docs/howto.md is real code: every snippet runs, on a tiny seeded model with its sizes
cut down (CI stays fast), and the quick ones also as written on SmolLM2-135M.

The tiny model replaces ``cwlens.load_model("smollm2-135m")``; each cut is listed in
``CUTS`` and must appear in its snippet exactly once, so a change to the page that the
test no longer follows fails here instead of passing unread.
"""

import re
from pathlib import Path

import pytest

import cwlens

PAGE = Path(__file__).resolve().parents[1] / "docs" / "howto.md"


def snippets() -> dict[str, str]:
    """``{section heading: its python block}``, in page order."""
    text = PAGE.read_text(encoding="utf-8")
    out = {}
    for part in re.split(r"^## ", text, flags=re.M)[1:]:
        title = part.splitlines()[0].strip()
        blocks = re.findall(r"```python\n(.*?)```", part, re.S)
        assert len(blocks) == 1, f"{title!r}: one python block per task"
        out[title] = blocks[0]
    return out


SNIPPETS = snippets()
SINKS, ONE_HEAD, FAITHFULNESS, CIRCUITS, LONG = SNIPPETS  # the five tasks, in page order

# what the tiny run changes: (as written, on the tiny model)
CUTS: dict[str, list[tuple[str, str]]] = {
    SINKS: [("text = \"When Mary and John went to the store, John gave a drink to Mary.\"",
             "text = \"when mary and john went to the store john gave a drink to mary .\"")],
    ONE_HEAD: [("text = \"When Mary and John went to the store, John gave a drink to\"",
                "text = \"when mary and john went to the store john gave a drink to\"")],
    FAITHFULNESS: [("n=8", "n=2"), ("max_tokens=64", "max_tokens=24")],
    # the tiny word-level vocabulary holds two names, IOI needs three: the same calls on
    # induction (the IOI task on the real tokenizer: test_ioi_task_builds_on_smollm2)
    CIRCUITS: [("build_task(\"ioi\", model, n_prompts=8)", "build_task(\"induction\", model, n_prompts=2, length=4)")],
    LONG: [("[:, :30_000]", "[:, :300]")],
}


def test_the_page_has_the_five_tasks():
    assert len(SNIPPETS) == 5 and set(CUTS) == set(SNIPPETS)
    for title, code in SNIPPETS.items():
        assert 'cwlens.load_model("smollm2-135m")' in code, title
        for written, _ in CUTS[title]:
            assert code.count(written) == 1, (title, written)


@pytest.fixture(scope="module")
def tiny():
    from cwlens.testing import tiny_model

    return tiny_model("llama")


def run(code: str, model, monkeypatch, tmp_path, capsys) -> str:
    """Run ``code`` with ``cwlens.load_model`` giving ``model``, in ``tmp_path``; its stdout."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cwlens, "load_model", lambda *a, **k: model)
    exec(compile(code, str(PAGE), "exec"), {})
    return capsys.readouterr().out


@pytest.mark.parametrize("title", list(SNIPPETS))
def test_snippet_runs_on_a_tiny_model(title, tiny, monkeypatch, tmp_path, capsys):
    code = SNIPPETS[title]
    for written, cut in CUTS[title]:
        code = code.replace(written, cut)
    out = run(code, tiny, monkeypatch, tmp_path, capsys)
    assert out.strip(), title
    if title == SINKS:
        assert re.search(r"^\d+ sink heads of 8$", out, re.M), out
    elif title == ONE_HEAD:
        assert "   attention: " in out and "contribution: " in out and "cosine" in out, out
    elif title == FAITHFULNESS:
        assert (tmp_path / "runs" / "howto" / "gsm8k.jsonl").stat().st_size > 0
        assert "contribution" in out and "comprehensiveness" in out, out
    elif title == CIRCUITS:
        assert "Spearman" in out, out
    elif title == LONG:
        assert re.search(r"tensor\([\d.]+\) \[", out), out


@pytest.mark.slow
@pytest.mark.parametrize("title", [SINKS, ONE_HEAD])
def test_snippet_runs_as_written_on_smollm2(title, smollm2, monkeypatch, tmp_path, capsys):
    out = run(SNIPPETS[title], smollm2, monkeypatch, tmp_path, capsys)
    if title == SINKS:
        n = int(re.search(r"^(\d+) sink heads of 270$", out, re.M).group(1))
        assert n > 0, out  # SmolLM2 has sink heads (docs/sinks.md)
    else:
        assert "   attention: " in out and "contribution: " in out, out


@pytest.mark.slow
def test_ioi_task_builds_on_smollm2(smollm2):
    """The IOI line of the circuits snippet, on the tokenizer it is written for."""
    from cwlens import circuits

    task = circuits.build_task("ioi", smollm2, n_prompts=8)
    assert task.clean.shape[0] == 8
