"""JupyterLab in headless chromium: breakpoint() on rank 1, answered by typing into the stdin box.

A scenario of its own (js/debug.mjs) on a JupyterLab server of its own; the screenshots of the
prompt and of the live table naming rank 1 in pdb (rank 0 waiting on it in all_sum) land in
test-artifacts/browser/pdb-rank-1.png and live-where-pdb.png. Skips as tests/browser/test_lab.py does.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys

import pytest

from tests.browser.test_lab import ARTIFACTS, JS, ROOT, descendants, free_port, missing, notebook, wait_http

SCENARIO_TIMEOUT = 180
pytestmark = pytest.mark.timeout(SCENARIO_TIMEOUT + 60)

CELLS = [
    "%load_ext mlx_jupyter\n%mlx_cluster start -n 2",
    "%%mlx_distributed\nimport numpy as np\nfrom mlx_jupyter import distributed as dist\n"
    "x = 10 * (group.rank() + 1)\nif group.rank() == 1:\n    breakpoint()\n"
    "y = x + 1\ntotal = int(dist.all_sum(np.array([y]), group=group, timeout=60)[0])\n"
    "print('rank', group.rank(), 'y', y, 'total', total)",
    "%mlx_cluster stop",
]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    why = missing()
    if why and os.environ.get("CI") == "true":
        pytest.fail(f"browser tests cannot run under CI: {why}", pytrace=False)
    if why:
        pytest.skip(why)
    import psutil

    tmp = tmp_path_factory.mktemp("labdebug")
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
    notebook(root / "debug.ipynb", CELLS)
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
        proc = subprocess.run(["node", str(JS / "debug.mjs"), base, token, str(ARTIFACTS), str(results_file)],
                              cwd=JS, timeout=SCENARIO_TIMEOUT, capture_output=True, text=True)
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
    assert name in results, f"step {name} did not run; node said: {results.get('_node', {}).get('detail')}"
    assert results[name]["ok"], f"{name}: {results[name]['detail']}"


def test_breakpoint_on_rank_1_answered_in_the_stdin_box(scenario):
    check(scenario, "debug_notebook_opens")
    check(scenario, "debug_live_table_names_pdb")
    check(scenario, "debug_prompt_answered")
    check(scenario, "debug_cluster_stops")
    assert (ARTIFACTS / "pdb-rank-1.png").stat().st_size > 10_000
    assert (ARTIFACTS / "live-where-pdb.png").stat().st_size > 10_000
