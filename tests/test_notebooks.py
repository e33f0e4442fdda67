"""Every notebook in notebooks/ runs top to bottom in a real kernel (nbclient), within a bound."""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import pytest

from needs import require_module

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
CELL_TIMEOUT = 120  # s; a whole notebook takes 10-40 s here
RECORDINGS = Path(__file__).resolve().parent / "fixtures" / "thunderbolt"


def run(name: str) -> nbformat.NotebookNode:
    """Execute notebooks/<name> (cwd = notebooks/) and return it with its outputs."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    env_before = os.environ.get("MLX_JUPYTER_RECORDINGS")
    os.environ["MLX_JUPYTER_RECORDINGS"] = str(RECORDINGS)
    try:
        client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3",
                                         resources={"metadata": {"path": str(NOTEBOOKS)}})
        client.execute()
    finally:
        if env_before is None:
            os.environ.pop("MLX_JUPYTER_RECORDINGS", None)
        else:
            os.environ["MLX_JUPYTER_RECORDINGS"] = env_before
    return nb


def text_of(nb: nbformat.NotebookNode) -> str:
    """Everything the notebook printed or displayed as text."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out["text"])
            elif "data" in out:
                parts.append(str(out["data"].get("text/plain", "")))
    return "\n".join(parts)


def mimetypes(nb: nbformat.NotebookNode) -> set[str]:
    return {m for cell in nb.cells for out in cell.get("outputs", []) for m in out.get("data", {})}


def test_every_notebook_is_listed_in_the_docs():
    listed = (NOTEBOOKS.parent / "docs" / "notebooks-and-widgets.md").read_text().split("## ", 2)[1]
    missing = [p.name for p in NOTEBOOKS.glob("*.ipynb") if f"`{p.name}`" not in listed]
    assert not missing, f"docs/notebooks-and-widgets.md does not list {missing}"


def test_every_notebook_is_tested():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == sorted(
        ["01-quickstart.ipynb", "02-cabling-a-mac-cluster.ipynb", "03-data-parallel-training.ipynb",
         "04-remote-cluster-over-ssh.ipynb", "05-launch-from-a-notebook.ipynb",
         "06-when-a-cell-hangs.ipynb",
         "07-slurm-cluster.ipynb",   # needs Slurm: run on the Slurm bed by tests/slurm/test_notebook_slurm.py
         "08-sharded-chat.ipynb", "buffers_and_backends.ipynb"])


@pytest.mark.timeout(240)
def test_quickstart():
    t0 = time.monotonic()
    out = text_of(run("01-quickstart.ipynb"))
    assert "rank 0 of 2" in out and "rank 1 of 2" in out
    assert "MLX all_sum: [3.0, 3.0, 3.0, 3.0]" in out
    assert "core all_sum: [0.0, 3.0, 6.0, 9.0]" in out
    assert "cluster stopped" in out
    assert time.monotonic() - t0 < 200


@pytest.mark.timeout(180)
def test_cabling():
    nb = run("02-cabling-a-mac-cluster.ipynb")
    out = text_of(nb)
    assert "backend: jaccl" in out
    assert "missing cable: m3-ultra-1 <-> m3-ultra-2" in out
    assert "jaccl is not possible: Incomplete mesh" in out
    assert "chosen: jaccl-ring" in out
    assert "m3-ultra-1: auto, ok=True" in out
    assert '"backend": "jaccl-ring"' in out
    assert "application/vnd.jupyter.widget-view+json" in mimetypes(nb)
    # the recorded cable check, after Apply setup: every cable measured, the slow one flagged
    assert "5 cables checked in " in out and "4 ok, 1 flagged, 0 failed" in out, out
    assert "m3-ultra-2->m3-ultra-4 11.60 Gb/s, m3-ultra-4->m3-ultra-2 54.90 Gb/s, round trip 0.085 ms  <-- slow" in out
    assert "SetupNotAppliedWarning" not in out and "Traceback" not in out


@pytest.mark.timeout(240)
def test_data_parallel_training():
    nb = run("03-data-parallel-training.ipynb")
    out = text_of(nb)
    assert "weight checksums per rank" in out
    assert "image/png" in mimetypes(nb), "the loss plot is missing"
    # the loss went down on both ranks
    for rank in (0, 1):
        line = next(x for x in out.splitlines() if x.startswith(f"rank {rank}: loss") or f"[rank {rank}] rank {rank}: loss" in x)
        first, last = (float(v) for v in line.split("loss ")[1].split(" -> "))
        assert last < first / 3, line
    # rank 1 killed, restarted with its peer's model and optimizer: the same losses as if never killed
    assert "rank 1 died: " in out and "restored from rank 0 (" in out and "lost: Xs, Ys" in out, out
    for rank in (0, 1):
        assert f"rank {rank}: loss" in out and f"as if never killed: True" in out.split(f"rank {rank}: loss")[-1], out


@pytest.mark.timeout(240)
def test_remote_cluster_over_ssh(testbed, tmp_path, monkeypatch):
    """The ssh notebook against two namespace hosts, under the names its text uses."""
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", {"mac-studio-1": 1, "mac-studio-2": 2})
    monkeypatch.setenv("MLXJ_EXAMPLE_SSH_CONFIG", str(cfg))
    monkeypatch.setenv("MLXJ_EXAMPLE_CONTROLLER_IP", f"{testbed.net}.1")
    monkeypatch.delenv("MLXJ_EXAMPLE_HOSTS", raising=False)
    out = text_of(run("04-remote-cluster-over-ssh.ipynb"))
    assert "2 ranks ready" in out
    assert "rank 0 on h1: all_sum = 3" in out and "rank 1 on h2: all_sum = 3" in out, out
    assert "rank 0 still has x = 3" in out and "rank 1 still has x = 3" in out
    assert "cluster stopped" in out
    assert testbed.procs_matching("mlx_jupyter.cluster.rank.engine") == {}


@pytest.mark.timeout(240)
def test_remote_cluster_over_ssh_without_an_ssh_config(testbed, tmp_path, monkeypatch):
    """A home without ~/.ssh/config: ssh's defaults (~/.ssh's key and known_hosts), hosts by address."""
    ssh_dir = tmp_path / "home" / ".ssh"
    ssh_dir.mkdir(parents=True)
    shutil.copy(testbed.key, ssh_dir / "id_ed25519")
    shutil.copy(testbed.known_hosts, ssh_dir / "known_hosts")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLXJ_EXAMPLE_HOSTS", ",".join(testbed.ips[:2]))
    monkeypatch.setenv("MLXJ_EXAMPLE_CONTROLLER_IP", f"{testbed.net}.1")
    monkeypatch.delenv("MLXJ_EXAMPLE_SSH_CONFIG", raising=False)
    assert not (ssh_dir / "config").exists()
    out = text_of(run("04-remote-cluster-over-ssh.ipynb"))
    assert "rank 0 on h1: all_sum = 3" in out and "rank 1 on h2: all_sum = 3" in out, out
    assert "cluster stopped" in out
    assert testbed.procs_matching("mlx_jupyter.cluster.rank.engine") == {}


@pytest.mark.timeout(240)
def test_launch_from_a_notebook():
    out = text_of(run("05-launch-from-a-notebook.ipynb"))
    assert "[rank 0] rank 0 of 2: all_sum = 3" in out and "[rank 1] rank 1 of 2: all_sum = 3" in out, out
    assert "rank 1" in out and "exit code: 3" in out
    assert "[rank 0] rank 0 sees EXAMPLE_SETTING = 42" in out and "[rank 1] rank 1 sees EXAMPLE_SETTING = 42" in out
    assert not (NOTEBOOKS / "allsum_example.py").exists() and not (NOTEBOOKS / "hostfile_example.json").exists()


@pytest.mark.timeout(240)
def test_buffers_and_backends():
    require_module("mlx_jupyter._mlx_bridge", "the MLX bridge module (pip install -e . builds it)")
    nb = run("buffers_and_backends.ipynb")
    out = text_of(nb)
    assert "same memory as the numpy array: True" in out, out
    assert "mlx.core.array (2, 3) mlx.core.float32" in out, out
    assert "sum of x + 1: 4096" in out and "deleter calls: 1 with the address: True" in out, out
    assert "ValueError: unsupported dtype 'float128'" in out and "deleter calls: 1" in out, out
    assert "ring        machine=True  mlx=True  available=True" in out, out
    assert "mlx build" in out and "ring:" in out, out
    last = [o for o in nb.cells[-1].outputs if o.get("output_type") == "execute_result"]
    assert last == [], f"the last cell shows a stray result: {last}"


ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.mark.timeout(180)
def test_when_a_cell_hangs():
    """A real mismatched-collective hang: where shows it, the live view collapses, the fix runs."""
    nb = run("06-when-a-cell-hangs.ipynb")
    out = text_of(nb)
    assert re.search(r"rank 0 is in all_sum #\d+ at line 5 waiting on rank 1 for [0-9.]+ s; rank 1 is idle", out), out
    assert "[ranks 0-1] past the collective" not in out  # rank 0 never got past it
    assert re.search(r"the cell ran \d\.\d s: rank 0 released; rank 1 done", out), out
    assert "[ranks 0-1] [3. 3. 3. 3.]" in out, out
    assert "False" in out  # the hung run did not end by itself
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert any("timed out after 3 s" in "".join(e["traceback"]) for e in errors), errors
    assert any("rank 1 raised ZeroDivisionError" in "".join(e["traceback"]) for e in errors), errors
    # MLX's own collectives on world: the late rank named, then a mismatch named in the table and the error
    assert re.search(r"rank 0 waits in MLX all_sum #1 \(float32\[6\], built at line 5, evaluated at line 6\) on rank 1"
                     r"(?: for [0-9.]+ s)?; rank 1 has called 0 MLX collectives and is at line 4: if world", out), out
    assert "[ranks 0-1] array([2, 2, 2, 2, 2, 2], dtype=float32)" in out, out
    mismatch = ("MLX collectives do not match: rank 0's all_sum #1 of float32[4] (built at line 2) and "
                "rank 1's all_gather #1 of float32[8] (built at line 3)")
    assert any(mismatch in ANSI.sub("", "".join(e["traceback"])) for e in errors), errors
    assert "'scale': 0" in out and "'_ih'" not in out and "'In'" not in out, out  # p locals(): the user's names
    # one prompt for every rank (%mlx_debug --all): the rank whose loss differs stands out
    assert re.search(r"\[rank 0\] 3\.0\s.*\[rank 1\] nan", out, re.S), out


@pytest.mark.timeout(240)
def test_sharded_chat():
    """A tiny model made here, loaded sharded (tensor, then pipeline), chatted with, a reply stopped."""
    require_module("mlx_lm", "MLX-LM (pip install '.[notebooks]')")
    nb = run("08-sharded-chat.ipynb")
    out = text_of(nb)
    assert "'model.safetensors.index.json'" in out and "'tokenizer.json'" in out, out
    assert "[rank 0] rank 0: 2 of 4 attention heads in each layer" in out, out
    assert re.search(r"\[ranks 0-1\] '[^\n]+'", out), out  # plain MLX-LM: the same text on both ranks
    assert re.search(r"48 tokens · [0-9.]+ tokens/s · first token [0-9.]+ s · prompt \d+ tokens at \d+ tokens/s · token limit",
                     out), out
    stopped = re.search(r"(\d+) tokens · .* · stopped", out)
    assert stopped and int(stopped.group(1)) < 5000, out
    assert f"[ranks 0-1] stopped after {stopped.group(1)} tokens; world sums to 2.0" in out, out
    assert "[rank 0] rank 0: layers 2-3; " in out and "[rank 1] rank 1: layers 0-1; " in out, out
    assert "application/vnd.jupyter.widget-view+json" in mimetypes(nb)
    assert "cluster stopped" in out and "Traceback" not in out
