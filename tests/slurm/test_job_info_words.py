"""``job_info``'s state is squeue's word; ``describe_info`` says it with the reason or the nodes once, as
``JobState.describe`` does (the %mlx_cluster status line), and the panel adds nothing that repeats it."""

from __future__ import annotations

import pytest

from mlx_jupyter.cluster.slurm_allocation import describe_info, state_info
from mlx_jupyter.launch.slurm.parse import parse_squeue_line


@pytest.mark.parametrize("line", [
    "15|RUNNING|0:05|59:55|1:00:00|2|node[1-2]|None",
    "16|PENDING|0:00|1:00:00|1:00:00|2||Resources",
    "17|PENDING|0:00|1:00:00|1:00:00|2||None",
    "18|TIMEOUT|1:00:00|0:00|1:00:00|2|node[1-2]|TimeLimit",
])
def test_describe_info_says_what_describe_says(line):
    state = parse_squeue_line(line)
    info = state_info(state)
    assert describe_info(info) == state.describe()
    assert info["state"] == state.state and info["job_id"] == state.job_id   # the word alone: no nodes in it
    assert info["time_left_text"] == ("59 min 55 s" if state.running else "")


def test_gone_and_unknown_read_as_they_are():
    assert describe_info({"state": "gone", "reason": "", "nodes": ""}) == "gone"
    assert describe_info({"state": "released", "nodes": ""}) == "released"
