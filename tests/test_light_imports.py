"""The package facade imports no heavy dependency. (That the pure layers, cwlens.core and
cwlens.datasets, import none is an import-linter contract: pyproject.toml, tests/test_layers.py.)"""

import subprocess
import sys

import pytest

HEAVY = ("transformer_lens", "plotly", "pandas", "transformers")


@pytest.mark.parametrize("module", ["cwlens"])
def test_import_does_not_pull_heavy_dependencies(module):
    code = (
        f"import sys, {module}\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing {module} imported {out.stdout.strip()}"
