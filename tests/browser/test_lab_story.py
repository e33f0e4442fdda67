"""JupyterLab in headless chromium: one story in three places (issue 45 §6). A kernel's cluster whose cell hangs in
MLX's all_sum on rank 0 while rank 1 is done: the cell's table, the dashboard's headline and the panel's card say the
same sentence (op, number, line, culprit), the card says "running a cell on rank 0; done on rank 1"; Stop gives
where the ranks were. After a cell that shut MLX's `world` down, the card and the dashboard say it in the words of the
cell's refusal, with how to restart, instead of "2 of 2 ranks ok, idle".

A scenario of its own (js/story.mjs) on a JupyterLab server of its own with the panel; screenshots in
test-artifacts/browser/story-*.png (light and dark). Skips as tests/browser/test_lab.py does.
"""

from __future__ import annotations

import pytest

from tests.browser.lab_scenario import ARTIFACTS, check, lab_server, require_browser, run_scenario

SCENARIO_TIMEOUT = 240
pytestmark = pytest.mark.timeout(SCENARIO_TIMEOUT + 90)

CELLS = [
    "%load_ext mlx_jupyter\n%mlx_cluster start -n 2",
    # rank 0 waits in MLX's all_sum #1, which rank 1 never makes: its cell is done
    "%%mlx_distributed\nx = mx.ones(4)\nif world.rank() == 0:\n    y = mx.distributed.all_sum(x, group=world)\n"
    "    mx.eval(y)\nprint('end', world.rank())",
    # rank 1 built another collective and raises: no drain can make it, so world is shut down to release rank 0
    "%%mlx_distributed\ngroup.barrier()\nif world.rank() == 1:\n    g = mx.distributed.all_gather(mx.ones(5))\n"
    "    1/0\nmx.eval(mx.distributed.all_sum(mx.ones(3)))",
    "%%mlx_distributed\nmx.eval(mx.distributed.all_sum(mx.ones(2)))",
    "%mlx_cluster stop",
]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    require_browser()
    tmp = tmp_path_factory.mktemp("labstory")
    with lab_server(tmp, {"story.ipynb": CELLS}, panel=True, log_as="lab-story.log") as lab:
        yield run_scenario(lab, "story.mjs", SCENARIO_TIMEOUT)


def test_a_hang_is_one_story_in_the_cell_the_dashboard_and_the_panel(scenario):
    check(scenario, "story_cluster_and_its_faces_open")
    check(scenario, "story_hang_same_words_in_three_places")
    assert (ARTIFACTS / "story-hang.png").stat().st_size > 10_000
    assert (ARTIFACTS / "story-hang-dark.png").stat().st_size > 10_000


def test_world_shut_down_is_said_on_the_panel_and_the_dashboard(scenario):
    check(scenario, "story_world_shut_down_said_everywhere")
    assert (ARTIFACTS / "story-world-shut-down-dark.png").stat().st_size > 10_000


def test_the_cluster_stops_and_no_console_errors(scenario):
    check(scenario, "story_cluster_stops")
    check(scenario, "console_errors")
