"""The documentation's commands, run where this machine allows (no Macs, GPUs or remote hosts)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "mlx_jupyter"]


def blocks(doc: str, lang: str) -> list[str]:
    text = (ROOT / doc).read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_readme_opens_with_the_two_commands() -> None:
    first = (ROOT / "README.md").read_text().split("```")[1].strip().splitlines()
    assert first[0] == "bash" and len(first) == 3
    assert "mlx-jupyter demo" in first[1] and ".ci/run" in first[2]
    assert "pytest" in (ROOT / ".ci/run").read_text()


def test_getting_started_notebook_snippet_runs_in_a_kernel(tmp_path: Path) -> None:
    cells = blocks("docs/getting-started.md", "python")[:2] + ["%mlx_cluster stop"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c.strip()) for c in cells])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in nb.cells[1].outputs)
    assert "3, 3, 3, 3" in text.replace(".", ""), text


@pytest.mark.parametrize("command", [["doctor"], ["demo"]])
def test_terminal_checks_from_getting_started(command: list[str], tmp_path: Path) -> None:
    p = subprocess.run(CLI + command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    if command == ["doctor"]:
        assert "ring" in p.stdout
        return
    for r in (0, 1):  # each rank's own sums, from both libraries, and the checked summary
        assert f"rank {r} of 2: mlx_jupyter all_sum = [1.0, 3.0, 5.0, 7.0], MLX all_sum = [1.0, 3.0, 5.0, 7.0]" \
            in p.stdout, p.stdout
    assert "demo: 2 ranks agree: ours and MLX's all_sum both gave [1.0, 3.0, 5.0, 7.0] on every rank" in p.stdout


def test_demo_fails_when_a_rank_disagrees(capsys) -> None:
    """The demo's agreement is checked on the ranks: a wrong expectation on them fails it, naming the rank."""
    from mlx_jupyter.commands import demo

    wrong = demo.RANK_CODE.replace("expected = [", "expected = [0.5] + [")
    assert wrong != demo.RANK_CODE
    assert demo.main([], rank_code=wrong) != 0
    out = capsys.readouterr()
    assert "agree" not in out.out


def test_launch_a_script_on_two_local_ranks(tmp_path: Path) -> None:
    assert "mlx-jupyter launch -n 2 -- python train.py" in blocks("docs/getting-started.md", "bash")[0]
    (tmp_path / "train.py").write_text(
        "import mlx.core as mx\n"
        "w = mx.distributed.init(strict=True, backend='ring')\n"
        "print('sum', mx.distributed.all_sum(mx.ones(2) * (w.rank() + 1), group=w).tolist())\n")
    from mlx_jupyter.net.ports import free_port_block

    port = str(free_port_block(2))
    p = subprocess.run(CLI + ["launch", "-n", "2", "-p", port, "--", sys.executable, "train.py"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("sum [3.0, 3.0]") == 2, p.stdout


def section(doc: str, heading: str) -> str:
    """The text of `## heading` in doc, up to the next `## `."""
    text = (ROOT / doc).read_text()
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_mpi_notebook_lines_parse_and_run_locally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The MPI section's notebook lines: valid %mlx_cluster arguments, and the one-machine one runs."""
    import shutil

    from IPython.core.magic_arguments import parse_argstring

    from mlx_jupyter.magics import MLXMagics

    lines = re.findall(r"`(%mlx_cluster start [^`]*)`", section("docs/getting-started.md", "MPI"))
    assert lines == ["%mlx_cluster start --hosts h1,h2 -n 1 --backend mpi", "%mlx_cluster start -n 2 --backend mpi"]
    for line in lines:
        args = parse_argstring(MLXMagics.mlx_cluster, line.split(" ", 1)[1])
        assert args.action == "start" and args.backend == "mpi"
    if shutil.which("mpirun") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("mpirun is missing under CI: .ci/run installs openmpi-bin")
        pytest.skip("mpirun is not installed (apt-get install openmpi-bin)")
    if os.geteuid() == 0:  # as the doc says: Open MPI refuses root without these
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    cells = ["%load_ext mlx_jupyter", lines[1],
             "%%mlx_distributed\nprint('mpi', world.size(), mx.distributed.all_sum(mx.ones(2) * (world.rank() + 1), group=world).tolist())",
             "%mlx_cluster stop"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[2].outputs)
    assert "mpi 2 [3.0, 3.0]" in text, text
    assert "cluster stopped" in "".join(o.get("text", "") for o in nb.cells[3].outputs)


def test_hostfile_doc_examples_read_with_our_reader(tmp_path: Path) -> None:
    from mlx_jupyter.hostfile import read_hostfile

    examples = blocks("docs/hostfiles.md", "json")
    assert len(examples) == 2
    plain, configured = examples
    path = tmp_path / "plain.json"
    path.write_text(plain)
    hf = read_hostfile(str(path))
    assert [(h.ssh, list(h.ips)) for h in hf.hosts] == [("mac1", ["192.168.0.1"]), ("mac2", ["192.168.0.2"])]
    path = tmp_path / "configured.json"
    path.write_text(configured)
    hf = read_hostfile(str(path))
    assert [h.ssh for h in hf.hosts] == ["m1", "m2", "m3"]
    assert hf.backend == "jaccl" and list(hf.envs) == ["MLX_METAL_FAST_SYNCH=1"]
    assert [list(h.rdma) for h in hf.hosts][0] == [None, "rdma_en5", "rdma_en4"]


RECIPE = """
import json, os, sys
import mlx.core as mx
import numpy as np
from mlx_jupyter import distributed as dist

world = mx.distributed.init(backend="ring", strict=True)
mine = mx.distributed.all_sum(mx.ones(3) * (world.rank() + 1), group=world)
group = dist.init(strict=True, timeout=60)
ours = dist.all_sum(np.arange(3, dtype=np.float32) * (group.rank() + 1), group=group, timeout=60)
print(json.dumps({"rank": world.rank(), "size": world.size(), "mlx": mine.tolist(), "core": ours.tolist(),
                  "core_rank": group.rank()}))
"""


@pytest.mark.timeout(120)
def test_without_launcher_recipe_two_local_ranks(tmp_path: Path) -> None:
    """docs/without-launcher.md's ring recipe by hand: MLX_HOSTFILE and MLX_RANK only, no launcher."""
    import json
    import secrets

    from mlx_jupyter.net.ports import free_port_block

    doc = (ROOT / "docs/without-launcher.md").read_text()
    assert "`MLX_HOSTFILE` = path of a JSON list" in doc and "+`MLX_JUPYTER_PORT_OFFSET` (default 1000)" in doc
    port = free_port_block(2)
    hostfile = tmp_path / "ring.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{port}"], [f"127.0.0.1:{port + 1}"]]))
    (tmp_path / "train.py").write_text(RECIPE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLX_", "OMPI_", "PMI", "SLURM_"))}
    env.update(MLX_HOSTFILE=str(hostfile), MLX_JUPYTER_TOKEN=secrets.token_hex(16))
    procs = [subprocess.Popen([sys.executable, "train.py"], cwd=tmp_path, env={**env, "MLX_RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=90)
            assert p.returncode == 0, err
            outs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert [o["rank"] for o in outs] == [0, 1] and [o["core_rank"] for o in outs] == [0, 1]
    assert all(o["size"] == 2 and o["mlx"] == [3.0, 3.0, 3.0] and o["core"] == [0.0, 3.0, 6.0] for o in outs)
