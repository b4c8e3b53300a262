"""notebooks/explore.ipynb runs top to bottom in a real kernel (the venv's Python) and is stored without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.slow  # end-to-end: runs whole scenarios (make test-fast skips it)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "explore.ipynb"


def test_notebook_is_stored_without_outputs() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code
    assert all(c.outputs == [] and c.execution_count is None for c in code)


def test_notebook_executes() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # jupyter_client runs a kernelspec whose argv starts with "python" under sys.executable: the venv's.
    client = NotebookClient(nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(ROOT)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2  # the divergence scatter and the per-group usage plot
    text = "\n".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "complete - 440 steps, 200 requests" in text
    table = nb.cells[-1].outputs[-1]["data"]["text/plain"]
    # Request r under each policy: resume point and outcome (docs/divergence.md, ext 16).
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:] if line.strip()}
    assert set(rows) == {"reconciled", "max_per_group", "trim_to_min", "pr48425"}, table
    assert rows["reconciled"][5:7] == ["32", "recompute"]
    assert rows["trim_to_min"][5:7] == ["48", "ok"]
    assert rows["max_per_group"][6] == "crash"
