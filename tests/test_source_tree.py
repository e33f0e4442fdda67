"""Jupyter started in the clone after a plain (non-editable) install: the checkout's sources come
first on sys.path and have no compiled core, yet the kernel and its ranks work.

The environment is what `pip install .` makes: a venv whose site-packages holds the package with its
built `_core` (copied from this venv's build) and, through a .pth line, this venv's dependencies.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]


def _site(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, timeout=30)
    return Path(out.stdout.strip())


def make_venv(folder: Path, installed: bool) -> Path:
    """A venv that sees this one's dependencies; with ``installed``, mlx_jupyter as a wheel installs it."""
    import mlx_jupyter._core as core

    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    python = folder / "bin" / "python"
    site = _site(python)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    if installed:
        shutil.copytree(ROOT / "mlx_jupyter", site / "mlx_jupyter", ignore=shutil.ignore_patterns("__pycache__"))
        for built in Path(core.__file__).parent.glob("_*.so"):
            shutil.copy2(built, site / "mlx_jupyter" / built.name)
        assert not list((ROOT / "mlx_jupyter").glob("_core*.so")), "the checkout must not hold a built core here"
    return python


@pytest.fixture(scope="module")
def installed_python(tmp_path_factory) -> Path:
    return make_venv(tmp_path_factory.mktemp("installed") / "venv", installed=True)


def test_the_checkout_steps_aside_for_the_installed_build(installed_python: Path) -> None:
    code = ("import mlx_jupyter, mlx_jupyter.buffers; from mlx_jupyter import distributed as dist; "
            "print(mlx_jupyter.__file__); print(dist.init().size())")
    p = subprocess.run([str(installed_python), "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    where, size = p.stdout.split()
    assert Path(where).parent == _site(installed_python) / "mlx_jupyter" and size == "1"
    p = subprocess.run([str(installed_python), "-m", "mlx_jupyter", "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "usage: mlx-jupyter" in p.stdout, p.stderr


def test_a_checkout_without_any_build_says_what_shadows_what(tmp_path: Path) -> None:
    python = make_venv(tmp_path / "venv", installed=False)
    p = subprocess.run([str(python), "-c", "from mlx_jupyter import distributed"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and f"{ROOT / 'mlx_jupyter'} is a source checkout" in last, p.stderr
    assert f"{python} -m pip install -e {ROOT}" in last, last


@pytest.mark.timeout(240)
def test_a_kernel_started_in_the_clone_runs_cells_on_ranks(installed_python: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = tmp_path / "jupyter" / "kernels" / "installed"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(json.dumps({
        "argv": [str(installed_python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "installed mlx-jupyter", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    cells = [
        "import mlx_jupyter\nfrom mlx_jupyter import distributed as dist\nprint('kernel uses', mlx_jupyter.__file__)",
        "%load_ext mlx_jupyter\n%mlx_cluster start -n 2",
        "%%mlx_distributed\nimport os, mlx_jupyter, numpy as np\nfrom mlx_jupyter import distributed as dist\n"
        "print('rank cwd', os.getcwd(), 'package', mlx_jupyter.__file__)\n"
        "print('sum', dist.all_sum(np.ones(2) * (group.rank() + 1), group=group).tolist())",
        "%mlx_cluster stop",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="installed",
                            resources={"metadata": {"path": str(ROOT)}}).execute()
    text = "".join(o.get("text", "") for cell in nb.cells for o in cell.outputs)
    installed = str(_site(installed_python) / "mlx_jupyter" / "__init__.py")
    assert f"kernel uses {installed}" in text, text
    assert f"rank cwd {ROOT} package {installed}" in text, text
    assert "sum [3.0, 3.0]" in text and "ranks 0-1" in text, text
