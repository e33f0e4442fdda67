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

import os

import pytest

from needs import require
from slurmbed import SlurmBed, missing_requirements
from tests.browser.lab_scenario import ARTIFACTS, check, lab_server, require_browser, run_scenario

SCENARIO_TIMEOUT = 300   # s, the whole browser scenario (a Slurm allocation, then srun, then two themes)
pytestmark = pytest.mark.timeout(SCENARIO_TIMEOUT + 150)

CELLS = [
    "%load_ext mlx_jupyter\n%mlx_cluster start --slurm --nodes 2 -n 1 --time 10",
    "%mlx_cluster stop",
]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    require_browser()
    require("the Slurm test bed (root, slurmctld, slurmd, munge)", missing_requirements())
    tmp = tmp_path_factory.mktemp("labslurm")
    bed = SlurmBed(tmp / "slurmbed", n=2, cpus=2).up()
    try:
        task_tmp = tmp / "task-tmp"   # the tasks' TMPDIR (srun exports ours), as tests/slurm's fixture gives it
        task_tmp.mkdir()
        task_tmp.chmod(0o1777)
        env = {**os.environ, **bed.env(), "TMPDIR": str(task_tmp)}
        with lab_server(tmp, {"slurm.ipynb": CELLS}, panel=True, env=env, log_as="lab-slurm.log") as lab:
            yield run_scenario(lab, "slurm.mjs", SCENARIO_TIMEOUT, env={**os.environ, **bed.env()})
    finally:
        left = bed.slurm("squeue", "--noheader", "--format=%i %j %T", check=False).stdout.strip()
        if left:
            bed.slurm("scancel", "--user=root", check=False)
        bed.down()
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
