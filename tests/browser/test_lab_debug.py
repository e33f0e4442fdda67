"""JupyterLab in headless chromium: breakpoint() on rank 1, answered by typing into the stdin box.

A scenario of its own (js/debug.mjs) on a JupyterLab server of its own; the screenshots of the
prompt and of the live table naming rank 1 in pdb (rank 0 waiting on it in all_sum) land in
test-artifacts/browser/pdb-rank-1.png and live-where-pdb.png. Skips as tests/browser/test_lab.py does.
"""

from __future__ import annotations

import pytest

from tests.browser.lab_scenario import ARTIFACTS, check, lab_scenario

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
    yield from lab_scenario(tmp_path_factory.mktemp("labdebug"), "debug.ipynb", CELLS, "debug.mjs", SCENARIO_TIMEOUT)


def test_breakpoint_on_rank_1_answered_in_the_stdin_box(scenario):
    check(scenario, "debug_notebook_opens")
    check(scenario, "debug_live_table_names_pdb")
    check(scenario, "debug_prompt_answered")
    check(scenario, "debug_cluster_stops")
    assert (ARTIFACTS / "pdb-rank-1.png").stat().st_size > 10_000
    assert (ARTIFACTS / "live-where-pdb.png").stat().st_size > 10_000
