"""Every notebook in notebooks/ runs top to bottom on the offline model (outputs are not kept).

The kernel talks over unix sockets in the test's own folder, not TCP: with TCP, jupyter_client
picks free ports, releases them and lets the kernel bind them, and two pytest workers starting
kernels at once can take the same port ("Address already in use", kernel died before replying;
CI stop 33 failed on that race).
"""

from pathlib import Path

import nbformat
import pytest
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        "strip outputs before committing"
    )
    km = KernelManager(
        kernel_name="python3",
        transport="ipc",
        connection_file=str(tmp_path / "kernel.json"),
        ip=str(tmp_path / "kernel-ipc"),
    )
    NotebookClient(
        nb,
        km=km,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    errors = [
        o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"
    ]
    assert not errors
