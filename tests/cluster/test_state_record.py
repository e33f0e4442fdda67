"""The opt-in per-cell record of each rank's own names (issue 33 §2): a rank killed with SIGKILL
comes back on restart with its own state as of its last finished cell, its peers giving the
replicated names; with the record off, what differs across ranks is reported lost."""

from __future__ import annotations

import os
import signal
import time

import pytest

from mlx_jupyter import Cluster
from mlx_jupyter.cluster.cells.display import show_run

pytestmark = pytest.mark.timeout(240)

CELLS = [
    "import numpy as np\nr = world.rank()\nshard = np.full(4, r)\nw = np.arange(3.0)",
    "shard = shard + 10\nw = w * 2\ng = (mx.arange(4) * (r + 1)).astype(mx.bfloat16)",   # lazy, bfloat16
]


def kill(c: Cluster, rank: int) -> None:
    """SIGKILL ``rank`` (what the OOM killer does) and wait until the cluster has seen it die."""
    os.kill(c.rank_infos()[rank].pid, signal.SIGKILL)
    end = time.monotonic() + 30
    while rank not in c.dead and time.monotonic() < end:
        time.sleep(0.05)
    assert rank in c.dead


def run_ok(c: Cluster, code: str) -> None:
    run = c.run(code)
    show_run(run, timeout=60)
    assert not run.failed, run


def test_a_killed_rank_comes_back_with_its_own_record_of_its_last_finished_cell():
    with Cluster(n=2, timeout=60, record_state=True) as c:
        for code in CELLS:
            run_ok(c, code)
        records = c.records.describe(c, wait=30)
        cell, at = records[1]["cell"], records[1]["time"]
        assert records[0]["on"] and records[1]["on"] and {"shard", "w", "r", "g", "np"} <= set(records[1]["names"]), records
        run = c.run("shard = shard + 100\nraise ValueError('not a finished cell')")   # changes shard, then fails
        assert run.wait(60) and run.failed
        assert c.records.describe(c, wait=30)[1]["time"] == at, "a cell that failed is not recorded"
        kill(c, 1)
        c.restart(quiet=True)
        line = c.last_restart
        assert f"rank 1 died: 1 name restored from rank 0 (w)" in line, line
        assert f"from its own record of cell {cell} (g, r, shard)" in line, line
        assert "lost" not in line.split("rank 1 died")[1], line
        assert c.execute("shard.tolist(), w.tolist(), r, g.tolist()", timeout=60) == [
            "([110, 110, 110, 110], [0.0, 2.0, 4.0], 0, [0.0, 1.0, 2.0, 3.0])",
            "([11, 11, 11, 11], [0.0, 2.0, 4.0], 1, [0.0, 2.0, 4.0, 6.0])"]
        assert "own record of cell" in c.restart_origins[1] and "from rank 0" in c.restart_origins[1], \
            c.restart_origins
        assert c.restart_origins[0] == "its own names"
        # the new rank records on, from the same folder: its clean cells (the execute above) are recorded
        new = c.records.describe(c, wait=30)[1]
        assert new["on"] and new["time"] > at and "shard" in new["names"], new


def test_with_the_record_off_what_differs_across_ranks_is_reported_lost():
    with Cluster(n=2, timeout=60) as c:
        for code in CELLS:
            run_ok(c, code)
        kill(c, 1)
        c.restart(quiet=True)
        line = c.last_restart
        assert "rank 1 died: 1 name restored from rank 0 (w)" in line, line
        assert "lost: g, r, shard (computed from the rank's number or process)" in line, line   # one live rank: nothing to compare
        assert "own record" not in line
        assert c.execute("'shard' in globals()", timeout=60) == ["True", "False"]


def test_an_unchanged_array_is_not_written_again():
    with Cluster(n=1, timeout=60, record_state=True) as c:
        run_ok(c, "import numpy as np\nbig = np.ones(1 << 22)")   # 32 MiB
        first = c.records.describe(c, wait=30)[0]
        assert first["written"] >= 8 << 22, first
        run_ok(c, "x = 1")
        second = c.records.describe(c, wait=30)[0]
        assert second["time"] > first["time"] and second["written"] == 0, second
        folder = first["folder"]
        assert os.path.isdir(folder)
    assert not os.path.exists(folder), "the record's folder outlived the cluster's stop"


def test_the_magics_start_option_is_parsed_and_listed():
    from mlx_jupyter.magic_help import CLUSTER_ACTIONS
    from mlx_jupyter.magics import MLXMagics, _parse

    assert _parse(MLXMagics.mlx_cluster, "start -n 2 --record-state").record_state is True
    assert _parse(MLXMagics.mlx_cluster, "start -n 2").record_state is False
    assert "--record-state" in CLUSTER_ACTIONS["start"][1]
