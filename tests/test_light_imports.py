"""The pure-math layer and the package facade import no heavy dependency."""

import subprocess
import sys

import pytest

HEAVY = ("transformer_lens", "plotly", "pandas", "transformers")


@pytest.mark.parametrize("module", ["cwlens", "cwlens.core", "cwlens.datasets"])
def test_import_does_not_pull_heavy_dependencies(module):
    code = (
        f"import sys, {module}\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing {module} imported {out.stdout.strip()}"
