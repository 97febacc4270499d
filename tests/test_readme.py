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
