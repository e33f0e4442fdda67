"""One scenario (a js/*.mjs script) against a JupyterLab server of its own, for the browser tests
that need a notebook of their own (test_lab_debug, test_lab_lockstep)."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.browser.test_lab import ARTIFACTS, JS, ROOT, descendants, free_port, missing, notebook, wait_http


def lab_scenario(tmp: Path, notebook_name: str, cells: list[str], script: str, timeout: float) -> Iterator[dict]:
    """Serve ``cells`` as ``notebook_name`` in a fresh JupyterLab, run ``node js/<script>`` against it
    (it writes each step's result), yield the results (``_node``: the script's own end), then stop the
    server and check that it left no process behind. Skips (locally) or fails (CI=true) as test_lab.py does."""
    why = missing()
    if why and os.environ.get("CI") == "true":
        pytest.fail(f"browser tests cannot run under CI: {why}", pytrace=False)
    if why:
        pytest.skip(why)
    import psutil

    root, config, runtime, settings = tmp / "root", tmp / "config", tmp / "runtime", tmp / "settings" / "@jupyterlab"
    for d in (root, config, runtime, settings / "apputils-extension", settings / "notebook-extension"):
        d.mkdir(parents=True)
    (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    (settings / "notebook-extension" / "tracker.jupyterlab-settings").write_text(json.dumps({"autoStartDefaultKernel": True}))
    (config / "jupyter_server_config.json").write_text(json.dumps({
        "LabServerApp": {"user_settings_dir": str(tmp / "settings"), "workspaces_dir": str(tmp / "workspaces")},
        "LabApp": {"expose_app_in_browser": True, "news_url": None,
                   "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"},
    }))
    notebook(root / notebook_name, cells)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_RUNTIME_DIR": str(runtime), "PYTHONPATH": str(ROOT)}
    log = open(tmp / "lab.log", "w")
    lab = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
         "--allow-root"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}/"
    results_file = tmp / "results.json"
    try:
        wait_http(f"{base}api/status?token={token}", lab, 60)
        proc = subprocess.run(["node", str(JS / script), base, token, str(ARTIFACTS), str(results_file)],
                              cwd=JS, timeout=timeout, capture_output=True, text=True)
        results = json.loads(results_file.read_text()) if results_file.exists() else {}
        results["_node"] = {"ok": proc.returncode == 0, "detail": (proc.stdout + proc.stderr)[-2000:]}
        yield results
    finally:
        children = descendants(lab.pid)
        lab.send_signal(signal.SIGINT)
        try:
            lab.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            lab.wait(5)
        log.close()
        _, alive = psutil.wait_procs(children, timeout=10)
        for p in alive:
            p.kill()
        assert not alive, f"processes left behind by the lab server: {[p.pid for p in alive]}"


def check(results: dict, name: str) -> None:
    """The scenario's step ``name`` ran and passed."""
    assert name in results, f"step {name} did not run; node said: {results.get('_node', {}).get('detail')}"
    assert results[name]["ok"], f"{name}: {results[name]['detail']}"
