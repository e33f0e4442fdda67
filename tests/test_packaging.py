"""`pip install .` alone ships the JupyterLab panel: the lab extension and the server extension, enabled.

The dev install is editable, but scikit-build-core still copies the wheel's data folder
(`labextension/install.cmake`) into sys.prefix at install time, and records it: so the venv's
files are what a wheel installs, as of the last install. A rebuilt bundle needs a reinstall.
The wheel's layout itself is checked by running install.cmake alone (no C++ build).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "mlx_jupyter" / "server" / "labextension"
NAME = "mlx-jupyter-lab"
JUPYTER = Path(sys.executable).with_name("jupyter")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
REINSTALL = "reinstall the package (.venv/bin/pip install -e . --no-build-isolation)"

pytest.importorskip("jupyterlab")


def jupyter(*args: str, tmp_path: Path) -> str:
    """`jupyter <args>` of this venv, with a config dir of its own (only sys.prefix's config counts)."""
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "NO_COLOR": "1"}
    env.pop("JUPYTER_PATH", None)
    p = subprocess.run([str(JUPYTER), *args], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return ANSI.sub("", p.stdout + p.stderr)


def tree(folder: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under folder."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_labextension_list_shows_it_enabled_and_ok(tmp_path):
    out = jupyter("labextension", "list", tmp_path=tmp_path)
    [line] = [x for x in out.splitlines() if NAME in x]
    assert re.search(rf"{NAME} v0\.1\.0 enabled\s+OK \(python, mlx-jupyter\)", line), line
    # found in this venv's data dir, not a user's
    section = out.split(NAME)[0].rsplit("labextensions", 1)[0].splitlines()[-1].strip()
    assert Path(section).resolve() == (Path(sys.prefix) / "share" / "jupyter").resolve(), out


def test_server_extension_list_shows_it_enabled(tmp_path):
    out = jupyter("server", "extension", "list", tmp_path=tmp_path)
    venv_config = str(Path(sys.prefix) / "etc" / "jupyter")
    sections = re.split(r"^Config dir: ", out, flags=re.M)
    [ours] = [s for s in sections if s.startswith(venv_config)]
    assert re.search(r"^\s+mlx_jupyter\.server enabled$", ours, flags=re.M), ours
    assert re.search(r"^\s+mlx_jupyter\.server\s+OK$", ours, flags=re.M), ours


def test_installed_data_is_the_committed_bundle():
    installed = Path(sys.prefix) / "share" / "jupyter" / "labextensions" / NAME
    assert (installed / "package.json").is_file(), f"{installed} is missing: {REINSTALL}"
    install = json.loads((installed / "install.json").read_text())
    assert install["packageManager"] == "python" and install["packageName"] == "mlx-jupyter"
    files = tree(installed)
    files.pop("install.json")
    assert files == tree(BUNDLE), f"the installed lab extension is not the checkout's bundle: {REINSTALL}"
    load = json.loads((installed / "package.json").read_text())["jupyterlab"]["_build"]["load"]
    assert re.fullmatch(r"static/remoteEntry\.[0-9a-f]+\.js", load) and (installed / load).is_file()
    config = Path(sys.prefix) / "etc" / "jupyter" / "jupyter_server_config.d" / "mlx_jupyter.json"
    assert json.loads(config.read_text()) == {"ServerApp": {"jpserver_extensions": {"mlx_jupyter.server": True}}}


def test_installed_data_is_recorded_so_uninstall_removes_it():
    record = {str(f).replace("\\", "/") for f in importlib.metadata.distribution("mlx-jupyter").files or []}
    prefix = "../../../"  # site-packages -> sys.prefix (as pip records data files)
    wanted = {f"share/jupyter/labextensions/{NAME}/{name}" for name in ["install.json", *tree(BUNDLE)]}
    wanted.add("etc/jupyter/jupyter_server_config.d/mlx_jupyter.json")
    recorded = {f.split(prefix, 1)[1] for f in record if f.startswith(prefix)}
    assert wanted <= recorded, f"not in the install record: {sorted(wanted - recorded)}; {REINSTALL}"


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_wheel_data_layout_from_install_cmake(tmp_path):
    """What the wheel's data folder gets: install.cmake alone, as scikit-build-core runs it."""
    assert "include(labextension/install.cmake)" in (ROOT / "CMakeLists.txt").read_text()
    src, build, data = tmp_path / "src", tmp_path / "build", tmp_path / "data"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(labext_layout NONE)\n"
        f"include(\"{(ROOT / 'labextension' / 'install.cmake').as_posix()}\")\n")
    for cmd in (["cmake", "-S", str(src), "-B", str(build), f"-DSKBUILD_DATA_DIR={data}"],
                ["cmake", "--install", str(build)]):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout + p.stderr
    ext = data / "share" / "jupyter" / "labextensions" / NAME
    files = tree(ext)
    assert json.loads((ext / "install.json").read_text())["packageName"] == "mlx-jupyter"
    files.pop("install.json")
    assert files == tree(BUNDLE)
    assert any(re.fullmatch(r"static/remoteEntry\.[0-9a-f]+\.js", f) for f in files)
    assert (data / "etc" / "jupyter" / "jupyter_server_config.d" / "mlx_jupyter.json").is_file()


def test_server_extension_dependency_is_declared():
    tomllib = pytest.importorskip("tomllib")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(re.match(r"jupyter_server\s*>=\s*2", d) for d in deps), deps
    installed = importlib.metadata.requires("mlx-jupyter") or []
    assert any(re.match(r"jupyter_server\s*>=\s*2", d) for d in installed), f"{installed}: {REINSTALL}"
    import jupyter_server  # what mlx_jupyter.server.handlers imports

    assert int(jupyter_server.__version__.split(".")[0]) >= 2


def _top_level_imports(source: str) -> set[str]:
    import ast

    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_notebooks_need_only_the_package_and_its_notebooks_extra():
    """What the example notebooks import (kernel cells and %%mlx_distributed cells) comes with
    `pip install ".[notebooks]"`, which the README names, JupyterLab included."""
    import nbformat
    from IPython.core.inputtransformer2 import TransformerManager
    from packaging.requirements import Requirement

    declared = {Requirement(r) for r in importlib.metadata.requires("mlx-jupyter") or []}
    base = {r.name.lower() for r in declared if r.marker is None or "extra" not in str(r.marker)}
    extra = {r.name.lower() for r in declared if r.marker is not None and 'extra == "notebooks"' in str(r.marker)}
    assert "jupyterlab" in extra, "the notebooks extra installs JupyterLab to open them in"
    dists = importlib.metadata.packages_distributions()
    needed: dict[str, set[str]] = {}
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "code":
                continue
            source = cell.source
            if source.startswith("%%"):   # a cell magic: its body runs (on the ranks), so it needs its imports too
                source = source.split("\n", 1)[1] if "\n" in source else ""
            code = TransformerManager().transform_cell(source)   # line magics and ! commands as Python
            for module in _top_level_imports(code) - set(sys.stdlib_module_names) - {"mlx_jupyter"}:
                for dist in dists.get(module, [module]):
                    needed.setdefault(dist.lower().replace("_", "-"), set()).add(path.name)
    missing = {d: sorted(nbs) for d, nbs in needed.items() if d not in base | extra and d != "mlx-cpu"}
    assert not missing, f"notebooks import packages that neither the package nor its notebooks extra installs: {missing}"
    assert "matplotlib" in needed and "matplotlib" in extra
    readme = (ROOT / "README.md").read_text()
    assert re.search(r'pip install (-q )?"\.\[notebooks\]"', readme) and "jupyter lab notebooks/" in readme
