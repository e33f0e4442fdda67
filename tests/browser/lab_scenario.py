"""What the browser tests share: a JupyterLab server of their own (:func:`lab_server`), a js/*.mjs scenario run
against it (:func:`run_scenario`), and the check of one of its steps (:func:`check`)."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JS = Path(__file__).resolve().parent / "js"
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not Path(CHROMIUM).exists():
        return f"no chromium at {CHROMIUM} (apt-get install chromium)"
    if shutil.which("node") is None:
        return "node is not installed"
    if importlib.util.find_spec("jupyterlab") is None:   # found, not imported: its import takes 2 s
        return "jupyterlab is not installed (pip install jupyterlab)"
    if not (ROOT / "mlx_jupyter" / "server" / "labextension" / "package.json").exists():
        return "the lab extension is not built (labextension/: npm install && npm run build:prod)"
    if not (JS / "node_modules" / "playwright-core").exists():
        if shutil.which("npm") is None:
            return "npm is not installed"
        try:
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=JS, check=True, timeout=180,
                           capture_output=True)
        except (subprocess.SubprocessError, OSError) as exc:
            return f"playwright-core could not be installed in tests/browser/js ({exc})"
    return None


def require_browser() -> None:
    """Skip (locally) or fail (under CI=true) when a piece the browser tests need is missing."""
    why = missing()
    if why and os.environ.get("CI") == "true":
        pytest.fail(f"browser tests cannot run under CI: {why}; .ci/run installs chromium and runs npm ci "
                    "in tests/browser/js", pytrace=False)
    if why:
        pytest.skip(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def notebook(path: Path, sources: list[str]) -> None:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def wait_http(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)  # polling a socket that is not up yet, not synchronising with a test step
    raise TimeoutError(f"jupyter lab did not answer {url} within {timeout} s")


def descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


@dataclass
class Lab:
    """A running JupyterLab: its URL, token, notebook folder and scratch folder."""

    base: str
    token: str
    root: Path
    tmp: Path
    pid: int
    started: set[int] = field(default_factory=set)  # its processes once the scenario ran (for the leftovers' message)


def lab_config(tmp: Path, panel: bool) -> dict[str, str]:
    """The server's folders under ``tmp``: a fresh settings profile (no news prompt, the notebook's kernel starts
    without asking) and, with ``panel``, our lab extension and server extension. The environment that names them."""
    config, runtime, labext = tmp / "config", tmp / "runtime", tmp / "labextensions"
    settings = tmp / "settings" / "@jupyterlab"
    for d in (tmp / "root", config, runtime, settings / "apputils-extension", settings / "notebook-extension"):
        d.mkdir(parents=True)
    (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    (settings / "notebook-extension" / "tracker.jupyterlab-settings").write_text(json.dumps({"autoStartDefaultKernel": True}))
    server: dict = {}
    lab_server_app: dict = {"user_settings_dir": str(tmp / "settings"), "workspaces_dir": str(tmp / "workspaces")}
    if panel:
        labext.mkdir()
        (labext / "mlx-jupyter-lab").symlink_to(ROOT / "mlx_jupyter" / "server" / "labextension")
        server = {"ServerApp": {"jpserver_extensions": {"mlx_jupyter.server": True}}}
        lab_server_app = {"extra_labextensions_path": [str(labext)], **lab_server_app}
    (config / "jupyter_server_config.json").write_text(json.dumps({
        **server,
        "LabServerApp": lab_server_app,
        "LabApp": {"expose_app_in_browser": True, "news_url": None,
                   "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"},
    }))
    return {"JUPYTER_CONFIG_DIR": str(config), "JUPYTER_RUNTIME_DIR": str(runtime)}


@contextmanager
def lab_server(tmp: Path, notebooks: Mapping[str, list[str]], *, panel: bool = False,
               env: Mapping[str, str] | None = None, log_as: str | None = None) -> Iterator[Lab]:
    """JupyterLab on 127.0.0.1 serving ``notebooks`` (name -> cell sources) from ``tmp/root``, with our panel when
    ``panel``, in ``env`` (default: this process's). At the end: jupyter's clean shutdown (SIGINT), its log kept as
    ARTIFACTS/``log_as``, and a failure if it left a process behind."""
    import psutil

    extra = lab_config(tmp, panel)
    root = tmp / "root"
    for name, cells in notebooks.items():
        notebook(root / name, cells)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port, token = free_port(), secrets.token_hex(16)
    log = open(tmp / "lab.log", "w")
    lab = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
         "--allow-root"], env={**(os.environ if env is None else env), **extra, "PYTHONPATH": str(ROOT)},
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    running = Lab(f"http://127.0.0.1:{port}/", token, root, tmp, lab.pid)
    try:
        wait_http(f"{running.base}api/status?token={token}", lab, 60)
        yield running
    finally:
        children = descendants(lab.pid)
        lab.send_signal(signal.SIGINT)  # jupyter's clean shutdown: kernels (and their clusters), then extensions
        try:
            lab.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            lab.wait(5)
        log.close()
        _, alive = psutil.wait_procs(children, timeout=10)
        for p in alive:
            p.kill()
        if log_as:
            shutil.copy(tmp / "lab.log", ARTIFACTS / log_as)
        assert not alive, (f"processes left behind by the lab server: {[p.pid for p in alive]}"
                           f" (of {sorted(running.started)})")


def run_scenario(lab: Lab, script: str, timeout: float, *args: str, env: Mapping[str, str] | None = None) -> dict:
    """``node js/<script> <lab url> <token> <screenshot dir> <results.json> [args]``: each step's result
    ({name: {ok, detail}}), and ``_node``, the script's own end."""
    results_file = lab.tmp / "results.json"
    proc = subprocess.run(["node", str(JS / script), lab.base, lab.token, str(ARTIFACTS), str(results_file), *args],
                          cwd=JS, env=env, timeout=timeout, capture_output=True, text=True)
    (ARTIFACTS / f"{Path(script).stem}-steps.log").write_text(proc.stdout + proc.stderr)  # when each step began
    lab.started = {p.pid for p in descendants(lab.pid)}
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    results["_node"] = {"ok": proc.returncode == 0, "detail": (proc.stdout + proc.stderr)[-2000:]}
    return results


def lab_scenario(tmp: Path, notebook_name: str, cells: list[str], script: str, timeout: float) -> Iterator[dict]:
    """A module fixture's body: ``cells`` as ``notebook_name`` in a JupyterLab of its own (no panel), ``node
    js/<script>`` run against it; yields its results."""
    require_browser()
    with lab_server(tmp, {notebook_name: cells}) as lab:
        yield run_scenario(lab, script, timeout)


def check(results: dict, name: str) -> None:
    """The scenario's step ``name`` ran and passed."""
    assert name in results, f"step {name} did not run; node said: {results.get('_node', {}).get('detail')}"
    assert results[name]["ok"], f"{name}: {results[name]['detail']}"
