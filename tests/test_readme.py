"""The README's quickstart is real code: run it as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_quickstart_block_runs(capsys):
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Quickstart for a TransformerLens user"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) <= 10
    exec(compile(code, "README quickstart", "exec"), {})
    worst = float(capsys.readouterr().out.strip().splitlines()[-1])
    assert worst < 1e-5


@pytest.mark.slow
def test_streaming_block_runs(capsys):
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Long texts: `stream` instead of `run_with_cache`"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README streaming example", "exec"), {})
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("torch.Size([30, 1, 9,") and float(last.split(")")[-1]) < 1e-5


ROOT = README.parent


def test_readme_is_a_guide_of_at_most_250_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def test_readme_links_resolve():
    """Every relative link of the README names a file of the repository (the docs pages
    the record moved to, the notebooks, the figures)."""
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local and all((ROOT / t).is_file() for t in local), [t for t in local if not (ROOT / t).is_file()]


def test_no_tool_writes_into_the_readme():
    """Generated tables live in docs/: no script, command or make target takes --readme or
    names README.md as a place to write."""
    sources = [*ROOT.joinpath("cwlens").rglob("*.py"), *ROOT.joinpath("scripts").glob("*"), ROOT / "Makefile"]
    hits = [str(p.relative_to(ROOT)) for p in sources if p.is_file()
            and re.search(r"--readme|summary-md[^\n]*README|README\.md\"\]", p.read_text(encoding="utf-8"))]
    assert not hits, hits


def test_results_section_is_a_guide():
    """"Results, in five lines": at most 15 lines, one sentence per result with a link to
    the page that holds its numbers (a 300-word bullet once sat here)."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Results, in five lines"):text.index("## Notebooks")]
    lines = section.strip().splitlines()
    assert len(lines) <= 15, len(lines)
    bullets = [line for line in lines if line.startswith("- ")]
    assert bullets
    for b in bullets:
        assert re.search(r"\]\(docs/[\w.]+\.md\)", b), b
        assert len(b.split()) <= 60, (len(b.split()), b[:60])
        body = re.sub(r"\([^)]*\)", "", b)  # links and asides
        assert body.rstrip().endswith(".") and body.count(". ") == 0, b[:60]
