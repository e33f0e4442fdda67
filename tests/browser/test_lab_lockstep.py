"""JupyterLab in headless chromium: breakpoint() on 4 ranks opens one lockstep prompt, `p loss` finds the
rank whose loss is nan in one command, `c` lets every rank go on (issue 32 §2).

A scenario of its own (js/lockstep.mjs) on a JupyterLab server of its own; the screenshot of the prompt
with the grouped answers lands in test-artifacts/browser/pdb-lockstep.png. Skips as
tests/browser/test_lab.py does.
"""

from __future__ import annotations

import pytest

from tests.browser.lab_scenario import ARTIFACTS, check, lab_scenario

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
    yield from lab_scenario(tmp_path_factory.mktemp("lablockstep"), "lockstep.ipynb", CELLS, "lockstep.mjs",
                            SCENARIO_TIMEOUT)


def test_one_prompt_for_four_ranks_finds_the_nan_rank(scenario):
    check(scenario, "lockstep_notebook_opens")
    check(scenario, "lockstep_prompt_groups_the_answers")
    check(scenario, "lockstep_continue_lets_every_rank_go_on")
    check(scenario, "lockstep_cluster_stops")
    assert (ARTIFACTS / "pdb-lockstep.png").stat().st_size > 10_000
