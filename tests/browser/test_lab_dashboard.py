"""JupyterLab in headless chromium: the dashboard as a monitor (issue 45). A kernel's cluster (``%mlx_cluster
start``, the README's path) gets live charts and MLX's memory like the panel's own; a healthy loop raises no
alarm and a rank that stalls does (after 2 s without progress); charts with time axes, values on hover and a
choice of window; a second dashboard opens as a tab; the card's layout; the --profile timeline on its own light
background in the dark theme.

A scenario of its own (js/dashboard.mjs) on a JupyterLab server of its own with the panel; screenshots in
test-artifacts/browser/dashboard-*.png, panel-card-layout*.png, profile-timeline-dark.png. Skips as
tests/browser/test_lab.py does.
"""

from __future__ import annotations

import pytest

from tests.browser.lab_scenario import ARTIFACTS, check, lab_server, require_browser, run_scenario

SCENARIO_TIMEOUT = 300
pytestmark = pytest.mark.timeout(SCENARIO_TIMEOUT + 90)

CELLS = [
    "%load_ext mlx_jupyter\n%mlx_cluster start -n 2",
    # a healthy training-like loop: MLX weights held, our core's all_sum and MLX's own as many times on each rank
    "%%mlx_distributed\nimport time, numpy as np\nfrom mlx_jupyter import distributed as dist\n"
    "weights = mx.zeros((1 << 22,))\nmx.eval(weights)\n"
    "for i in range(1000):\n    dist.all_sum(np.ones(16384), group=group)\n"
    "    mx.eval(mx.distributed.all_sum(mx.ones(1024), group=world))\n    time.sleep(0.01)\nprint('done')",
    # rank 1 stalls: rank 0 waits in all_sum for it
    "%%mlx_distributed\nimport time, numpy as np\nfrom mlx_jupyter import distributed as dist\n"
    "if group.rank() == 1:\n    time.sleep(6)\ndist.all_sum(np.ones(4), group=group, timeout=60)",
    "%%mlx_distributed --profile\nfor i in range(20):\n    dist.all_sum(np.ones(4096), group=group)",
    "%mlx_cluster stop",
]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    require_browser()
    tmp = tmp_path_factory.mktemp("labdash")
    with lab_server(tmp, {"train.ipynb": CELLS}, panel=True, log_as="lab-dashboard.log") as lab:
        yield run_scenario(lab, "dashboard.mjs", SCENARIO_TIMEOUT)


def test_a_kernels_cluster_has_live_charts_and_mlx_memory(scenario):
    """§4 and §3: the same charts for %mlx_cluster start's cluster; MLX's active, peak and cache beside RSS; §1: the
    collectives chart has MLX's own mx.distributed calls beside our core's, a line each, told apart in its legend."""
    check(scenario, "dash_kernel_cluster_starts")
    check(scenario, "dash_kernel_cluster_has_charts_and_mlx_memory")
    assert (ARTIFACTS / "dashboard-kernel-cluster-tab.png").stat().st_size > 10_000


def test_charts_have_a_choice_of_window(scenario):
    """§2: 1, 5 or 15 minutes; the time axis and the values under the cursor are in the step above."""
    check(scenario, "dash_window_choice")


def test_no_alarm_for_a_healthy_loop_and_one_for_a_stalled_rank(scenario):
    """§5: the headline only once a rank has not progressed for 2 s."""
    check(scenario, "dash_healthy_loop_raises_no_alarm")
    check(scenario, "dash_stalled_rank_raises_the_alarm")


def test_dark_theme_and_a_readable_profile_timeline(scenario):
    """§7 and §2: the timeline on its own light background with round ticks; the dashboard in the dark theme."""
    check(scenario, "dash_dark_theme_and_profile_timeline")
    assert (ARTIFACTS / "dashboard-kernel-cluster-tab-dark.png").stat().st_size > 10_000


def test_a_second_dashboard_opens_as_a_tab(scenario):
    check(scenario, "dash_second_dashboard_opens_as_a_tab")


def test_the_cards_layout(scenario):
    """§7: buttons in an even grid, memory on the card, 'starting: 1 of 2 ranks connected', the Restart question stays."""
    check(scenario, "panel_card_layout")
    assert (ARTIFACTS / "panel-card-layout-dark.png").stat().st_size > 5_000


def test_the_cluster_stops_and_no_console_errors(scenario):
    check(scenario, "dash_cluster_stops")
    check(scenario, "console_errors")
