"""How a step's end is told, from the reports alone (no Slurm needed): who failed first, who was terminated."""

from __future__ import annotations

from mlx_jupyter.launch.launch_config import LaunchConfig
from mlx_jupyter.vocab.rankinfo import EXITED, KILLED, RankInfo
from mlx_jupyter.launch.slurm import SlurmOptions
from mlx_jupyter.launch.slurm.job import SlurmJob
from mlx_jupyter.launch.slurm.parse import parse_srun_line


def ended(codes: dict[int, int], heard: list[int], srun_lines: list[str]) -> SlurmJob:
    """A 4-rank step whose ranks' exit reports were heard in ``heard`` order, after a failure."""
    job = SlurmJob(LaunchConfig(command=["x"], slurm=SlurmOptions()))
    job.ranks = [RankInfo(r, f"node{r + 1}", state="running") for r in range(4)]
    job.failures = [r for r in heard if codes[r] != 0]
    job._fail_timer = object()   # srun's --kill-on-bad-exit was at work
    for r in range(4):
        job.ranks[r].returncode, job.ranks[r].state = codes[r], (EXITED if r == heard[0] else KILLED)
    job._settle_failures([parse_srun_line(line) for line in srun_lines])
    return job


def test_a_terminated_rank_heard_of_first_is_not_the_failure():
    job = ended({0: 143, 1: 143, 2: 3, 3: 143}, [1, 0, 2, 3],
                ["srun: error: node3: task 2: Exited with exit code 3", "srun: error: node2: task 1: Exited with exit code 143"])
    assert job.failures == [2] and job.exit_code() == 3
    assert [i.state for i in job.ranks] == [KILLED, KILLED, EXITED, KILLED]
    assert job.summary() == "rank 2 on node3 exited with code 3; terminated: rank 0 on node1, rank 1 on node2, rank 3 on node4"


def test_ranks_failing_on_their_own_are_all_told_in_srun_s_order():
    job = ended({0: 1, 1: 143, 2: 0, 3: 1}, [0, 3, 1, 2],
                ["srun: error: node4: task 3: Exited with exit code 1", "srun: error: node1: task 0: Exited with exit code 1"])
    assert job.failures == [3, 0] and job.exit_code() == 1


def test_a_rank_killed_by_a_signal_of_its_own_stays_the_failure():
    job = ended({0: 137, 1: 143, 2: 143, 3: 143}, [0, 1, 2, 3], ["srun: error: node1: task 0: Killed"])
    assert job.failures == [0] and job.exit_code() == 137
    assert job.summary().startswith("rank 0 on node1 killed by SIGKILL")
