"""JupyterLab in headless chromium: breakpoint() on 4 ranks opens one lockstep prompt, `p loss` finds the
rank whose loss is nan in one command, `c` lets every rank go on (issue 32 §2).

A scenario of its own (js/lockstep.mjs) on a JupyterLab server of its own; the screenshot of the prompt
with the grouped answers lands in test-artifacts/browser/pdb-lockstep.png. Skips as
tests/browser/test_lab.py does.
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
    "%load_ext mlx_jupyter\n%mlx_cluster start -n 4",
    "%%mlx_distributed\nimport numpy as np\nfrom mlx_jupyter import distributed as dist\n"
    "loss = float('nan') if group.rank() == 3 else 3.0\nbreakpoint()\n"
    "total = dist.all_sum(np.array([group.rank() + 1]), group=group, timeout=60)\nprint('total', total)",
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

    tmp = tmp_path_factory.mktemp("lablockstep")
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
    notebook(root / "lockstep.ipynb", CELLS)
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
        proc = subprocess.run(["node", str(JS / "lockstep.mjs"), base, token, str(ARTIFACTS), str(results_file)],
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


def test_one_prompt_for_four_ranks_finds_the_nan_rank(scenario):
    check(scenario, "lockstep_notebook_opens")
    check(scenario, "lockstep_prompt_groups_the_answers")
    check(scenario, "lockstep_continue_lets_every_rank_go_on")
    check(scenario, "lockstep_cluster_stops")
    assert (ARTIFACTS / "pdb-lockstep.png").stat().st_size > 10_000
