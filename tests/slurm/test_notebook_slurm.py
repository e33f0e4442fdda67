"""notebooks/07-slurm-cluster.ipynb, run top to bottom in a real kernel against the Slurm bed."""

from __future__ import annotations

import re

import nbclient
import nbformat

from slurm_helpers import ROOT


def test_slurm_notebook_runs_on_the_bed(slurm, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    nb = nbformat.read(ROOT / "notebooks" / "07-slurm-cluster.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=90, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    text = "\n".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                     for c in nb.cells for o in c.get("outputs", []))
    assert "is UP" in text
    assert re.search(r"2 ranks ready in .*Slurm job \d+ on node1,node2", text), text
    assert "rank 0 on node1: all_sum = 3" in text and "rank 1 on node2: all_sum = 3" in text, text
    assert re.search(r"Slurm job \d+ RUNNING on node\[1-2\], (10 min|9 min \d+ s) left", text), text
    assert "cluster stopped" in text
