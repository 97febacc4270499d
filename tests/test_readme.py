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
