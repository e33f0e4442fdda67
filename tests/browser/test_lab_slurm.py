"""JupyterLab in headless chromium with a Slurm cluster on the bed (issue 36): the MLX Cluster panel's card and
the cluster's dashboard tab show its Slurm job (id, state, nodes, time left), in the light and dark themes; once
stopped, its job leaves the queue.

The panel's form and its REST API start clusters on hosts (n, hosts, hostfile, backend): neither takes
``scheduler``. So the cluster is started the way the panel's empty state says, in a notebook of this server
(``%mlx_cluster start --slurm``); the panel lists that kernel's cluster, and stops only its own, so the notebook
stops it. A scenario of its own (js/slurm.mjs) on a Slurm bed and a JupyterLab server of its own; screenshots in
test-artifacts/browser/slurm-*.png. Skips as tests/browser/test_lab.py and the Slurm tests do (needs.require):
locally without chromium or the bed; under CI (CI=true) that is a failure.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys

import pytest

from needs import require
from slurmbed import SlurmBed, missing_requirements
from tests.browser.lab_scenario import check
from tests.browser.test_lab import ARTIFACTS, JS, ROOT, descendants, free_port, missing, notebook, wait_http

SCENARIO_TIMEOUT = 300   # s, the whole browser scenario (a Slurm allocation, then srun, then two themes)
pytestmark = pytest.mark.timeout(SCENARIO_TIMEOUT + 150)

CELLS = [
    "%load_ext mlx_jupyter\n%mlx_cluster start --slurm --nodes 2 -n 1 --time 10",
    "%mlx_cluster stop",
]


def lab_config(tmp) -> dict:
    """The server's directories: a fresh settings profile, our lab extension, the mlx_jupyter server extension."""
    root, config, runtime, labext = tmp / "root", tmp / "config", tmp / "runtime", tmp / "labextensions"
    settings = tmp / "settings" / "@jupyterlab"
    for d in (root, config, runtime, labext, settings / "apputils-extension", settings / "notebook-extension"):
        d.mkdir(parents=True)
    (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    (settings / "notebook-extension" / "tracker.jupyterlab-settings").write_text(json.dumps({"autoStartDefaultKernel": True}))
    (labext / "mlx-jupyter-lab").symlink_to(ROOT / "mlx_jupyter" / "server" / "labextension")
    (config / "jupyter_server_config.json").write_text(json.dumps({
        "ServerApp": {"jpserver_extensions": {"mlx_jupyter.server": True}},
        "LabServerApp": {"extra_labextensions_path": [str(labext)], "user_settings_dir": str(tmp / "settings"),
                         "workspaces_dir": str(tmp / "workspaces")},
        "LabApp": {"expose_app_in_browser": True, "news_url": None,
                   "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"},
    }))
    return {"root": root, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_RUNTIME_DIR": str(runtime)}


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    why = missing()
    if why and os.environ.get("CI") == "true":
        pytest.fail(f"browser tests cannot run under CI: {why}", pytrace=False)
    if why:
        pytest.skip(why)
    require("the Slurm test bed (root, slurmctld, slurmd, munge)", missing_requirements())
    import psutil

    tmp = tmp_path_factory.mktemp("labslurm")
    bed = SlurmBed(tmp / "slurmbed", n=2, cpus=2).up()
    lab = log = None
    left = ""
    try:
        dirs = lab_config(tmp)
        root = dirs.pop("root")
        notebook(root / "slurm.ipynb", CELLS)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        task_tmp = tmp / "task-tmp"   # the tasks' TMPDIR (srun exports ours), as tests/slurm's fixture gives it
        task_tmp.mkdir()
        task_tmp.chmod(0o1777)
        port, token = free_port(), secrets.token_hex(16)
        env = {**os.environ, **bed.env(), **dirs, "TMPDIR": str(task_tmp), "PYTHONPATH": str(ROOT)}
        log = open(tmp / "lab.log", "w")
        lab = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}", "--ServerApp.open_browser=False",
             "--allow-root"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        base = f"http://127.0.0.1:{port}/"
        results_file = tmp / "results.json"
        wait_http(f"{base}api/status?token={token}", lab, 60)
        proc = subprocess.run(["node", str(JS / "slurm.mjs"), base, token, str(ARTIFACTS), str(results_file)],
                              cwd=JS, env={**os.environ, **bed.env()}, timeout=SCENARIO_TIMEOUT,
                              capture_output=True, text=True)
        results = json.loads(results_file.read_text()) if results_file.exists() else {}
        results["_node"] = {"ok": proc.returncode == 0, "detail": (proc.stdout + proc.stderr)[-2000:]}
        yield results
    finally:
        alive = []
        if lab is not None:
            children = descendants(lab.pid)
            lab.send_signal(signal.SIGINT)   # jupyter's clean shutdown: kernels (and their clusters), then extensions
            try:
                lab.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(lab.pid, signal.SIGKILL)
                lab.wait(5)
            _, alive = psutil.wait_procs(children, timeout=10)
            for p in alive:
                p.kill()
        if log is not None:
            log.close()
            (ARTIFACTS / "lab-slurm.log").write_text((tmp / "lab.log").read_text())
        left = bed.slurm("squeue", "--noheader", "--format=%i %j %T", check=False).stdout.strip()
        if left:
            bed.slurm("scancel", "--user=root", check=False)
        bed.down()
        assert not alive, f"processes left behind by the lab server: {[p.pid for p in alive]}"
        assert not left, f"Slurm jobs left in the queue: {left}"
        assert not bed.leftovers(), f"the Slurm bed left behind: {bed.leftovers()}"


def test_slurm_cluster_starts_on_the_bed(scenario):
    """``%mlx_cluster start --slurm --nodes 2 -n 1`` in the lab's notebook: 2 ranks in a RUNNING job on node[1-2]."""
    check(scenario, "slurm_cluster_starts")


def test_panel_card_shows_the_slurm_job(scenario):
    """The card: "Slurm job N · RUNNING on node[1-2] · T left" (the nodes once), N squeue's job; "ring · 2 ranks ·
    node1, node2" (the ranks' nodes, not 127.0.0.1); "2 of 2 ranks ok (on node1, node2)", each rank ok and idle by
    the owning notebook's record, none "remote" (screenshot slurm-panel.png)."""
    check(scenario, "panel_card_shows_the_job")
    assert (ARTIFACTS / "slurm-panel.png").stat().st_size > 10_000


def test_dashboard_tab_shows_the_slurm_job(scenario):
    """The card's Dashboard tab lists the job's id, state (RUNNING: the nodes have their own row), nodes and time
    left, the nodes as the hosts, and each rank on its node ok and idle (slurm-dashboard.png)."""
    check(scenario, "dashboard_shows_the_job")
    assert (ARTIFACTS / "slurm-dashboard.png").stat().st_size > 10_000


def test_slurm_job_in_the_dark_theme(scenario):
    """JupyterLab Dark: the job line and list in theme colours (slurm-panel-dark.png, slurm-dashboard-dark.png)."""
    check(scenario, "dark_theme")
    for name in ("slurm-panel-dark.png", "slurm-dashboard-dark.png"):
        assert (ARTIFACTS / name).stat().st_size > 10_000


def test_slurm_job_ends_when_the_cluster_stops(scenario):
    """``%mlx_cluster stop``: the card goes and the job leaves the queue within 30 s."""
    check(scenario, "slurm_cluster_stops")


def test_no_console_errors(scenario):
    check(scenario, "console_errors")
