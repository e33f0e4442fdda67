"""The documentation's commands, run where this machine allows (no Macs, GPUs or remote hosts)."""

from __future__ import annotations

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
    assert ("ring" in p.stdout) if command == ["doctor"] else ("ranks agree" in p.stdout)


def test_launch_a_script_on_two_local_ranks(tmp_path: Path) -> None:
    assert "mlx-jupyter launch -n 2 -- python train.py" in blocks("docs/getting-started.md", "bash")[0]
    (tmp_path / "train.py").write_text(
        "import mlx.core as mx\n"
        "w = mx.distributed.init(strict=True, backend='ring')\n"
        "print('sum', mx.distributed.all_sum(mx.ones(2) * (w.rank() + 1), group=w).tolist())\n")
    from mlx_jupyter.ports import free_port_block

    port = str(free_port_block(2))
    p = subprocess.run(CLI + ["launch", "-n", "2", "-p", port, "--", sys.executable, "train.py"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("sum [3.0, 3.0]") == 2, p.stdout
