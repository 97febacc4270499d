"""The import-linter contracts of pyproject.toml ([tool.importlinter]): the floors hold on
the real tree, and each kind of contract fails on a deliberate break of a copy of it."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the project's contracts, on the ``cwlens`` package under ``root``."""
    assert LINT is not None, "lint-imports is missing: pip install -e '.[dev]' (import-linter)"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([LINT, "--no-cache", "--no-logo", str(root / "pyproject.toml")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_contracts_hold_on_the_tree():
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Contracts: 5 kept, 0 broken." in out.stdout


BREAKS = [  # (module of the copy, the line appended, the contract it breaks, the import named)
    ("core/numerics.py", "import cwlens.cli.main",
     "layers: presentation > studies > job engine > engine > core | datasets > errors",
     "cwlens.core.numerics -> cwlens.cli.main"),
    ("engine/streaming.py", "from cwlens.plotting import save_figure",
     "layers: presentation > studies > job engine > engine > core | datasets > errors",
     "cwlens.engine.streaming -> cwlens.plotting"),
    ("engine/handle.py", "import cwlens.engine.streaming",
     "no circle: no two sibling modules or packages import each other", ".handle -> .streaming"),
    ("datasets/jsonl.py", "import pandas",
     "core and datasets import none of transformer_lens, plotly, pandas, transformers",
     "cwlens.datasets.jsonl -> pandas"),
    ("plotting/sinks.py", "import cwlens.report.html",
     "presentation: the command > replication | report | test helpers > figures",
     "cwlens.plotting.sinks -> cwlens.report.html"),
]


@pytest.mark.parametrize(("module", "line", "contract", "named"), BREAKS,
                         ids=[b[0] for b in BREAKS])
def test_a_deliberate_break_fails_its_contract(tmp_path, module, line, contract, named):
    shutil.copytree(ROOT / "cwlens", tmp_path / "cwlens",
                    ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    assert _lint(tmp_path).returncode == 0  # the copy holds before the break
    with open(tmp_path / "cwlens" / module, "a", encoding="utf-8") as f:
        f.write(f"\n{line}  # a deliberate break\n")
    out = _lint(tmp_path)
    assert out.returncode != 0
    assert f"{contract} BROKEN" in out.stdout
    assert named in out.stdout, out.stdout
