"""Local ranks each on their own share of the CPUs (vocab.binding, `--bind-to`)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from hypothesis import given, strategies as st

from launch_helpers import PY, cli, collector
from mlx_jupyter.launch import Launcher
from mlx_jupyter.vocab import binding

pytestmark = pytest.mark.timeout(120)

AFFINITY = "import os, json; print(json.dumps(sorted(os.sched_getaffinity(0))))"
needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU binding on this OS")
two_cpus = pytest.mark.skipif(len(binding.allowed_cpus() or []) < 2, reason="needs 2 CPUs")


@given(st.sets(st.integers(0, 255), max_size=64), st.integers(0, 80))
def test_shares_are_disjoint_equal_blocks_of_the_allowed_cpus(allowed, ranks):
    shares = binding.cpu_shares(sorted(allowed), ranks)
    if ranks < 2 or len(allowed) < ranks:
        assert shares is None
        return
    assert shares is not None and len(shares) == ranks
    assert len({len(s) for s in shares}) == 1 and len(shares[0]) == len(allowed) // ranks
    assert set().union(*shares) <= allowed and sum(map(len, shares)) == len(set().union(*shares))
    cpus = sorted(allowed)   # contiguous blocks of the sorted CPUs, in rank order
    assert [sorted(s) for s in shares] == [cpus[r * len(shares[0]):(r + 1) * len(shares[0])] for r in range(ranks)]


@pytest.mark.parametrize("allowed, ranks, shares", [
    ([5, 1, 3, 2, 4, 0, 3], 2, [{0, 1, 2}, {3, 4, 5}]),     # sorted, duplicates dropped, contiguous blocks
    ([7, 6, 5, 4, 3], 2, [{3, 4}, {5, 6}]),                  # the remainder (7) goes to nobody
    ([0, 1, 2, 3, 4, 5, 6], 3, [{0, 1}, {2, 3}, {4, 5}]),
    ([9, 8], 2, [{8}, {9}]), ([0, 1, 2], 3, [{0}, {1}, {2}]),
    ([0, 1], 3, None), ([0, 1, 2, 3], 1, None), ([0, 1], 0, None), ([], 2, None),
])
def test_shares_by_example(allowed, ranks, shares):
    got = binding.cpu_shares(allowed, ranks)
    assert got == (None if shares is None else [frozenset(s) for s in shares])


def test_describe_and_the_cpus_allowed_here():
    assert binding.describe(frozenset({3})) == "cpu 3" and binding.describe(frozenset({4, 2, 3})) == "cpus 2-4"
    assert binding.describe(frozenset({5, 0, 2})) == "cpus 0,2,5"
    if hasattr(os, "sched_getaffinity"):
        assert binding.allowed_cpus() == sorted(os.sched_getaffinity(0))
        every = binding.allowed_cpus()
        assert binding.plan("cores", 1) is None
        assert binding.plan("cores", 2) == binding.cpu_shares(every, 2)
        assert binding.plan("cores", len(every) + 1) is None
    assert binding.check_policy("cores") == "cores" and binding.check_policy("none", "x") == "none"
    with pytest.raises(ValueError, match=r"^bind_to 'x': choose one of cores, none$"):
        binding.check_policy("x", "bind_to")


def test_policy_names_the_flag_on_a_bad_value():
    with pytest.raises(ValueError, match="--bind-to 'sockets'.*cores, none"):
        binding.plan("sockets", 2)
    assert binding.plan("none", 2) is None


@needs_affinity
def test_a_child_spawned_inside_runs_on_the_share_and_the_thread_gets_its_cpus_back():
    before = os.sched_getaffinity(0)
    share = frozenset([min(before)])
    with binding.for_children(share) as bound:
        child = subprocess.run([PY, "-c", AFFINITY], capture_output=True, text=True, timeout=30)
    assert bound and json.loads(child.stdout) == sorted(share)
    assert os.sched_getaffinity(0) == before


def _affinities(args: list[str]) -> dict[int, list[int]]:
    done = cli([*args, PY, "-c", AFFINITY], timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [line.split("] ", 1) for line in done.stdout.splitlines() if line.startswith("[rank ")]
    return {int(tag[len("[rank "):]): json.loads(cpus) for tag, cpus in rows}


@needs_affinity
@two_cpus
def test_launched_ranks_are_bound_to_disjoint_shares():
    got = _affinities(["-n", "2"])
    assert sorted(got) == [0, 1]
    assert got[0] and got[1] and not set(got[0]) & set(got[1]), got
    assert set(got[0]) | set(got[1]) <= set(binding.allowed_cpus())


@needs_affinity
@two_cpus
def test_bind_to_none_and_more_ranks_than_cpus_leave_ranks_unbound():
    every = binding.allowed_cpus()
    assert _affinities(["-n", "2", "--bind-to", "none"]) == {0: every, 1: every}
    n = len(every) + 1
    assert _affinities(["-n", str(n)]) == {r: every for r in range(n)}


@needs_affinity
@two_cpus
def test_api_launch_binds_and_logs_the_share(capfd):
    out, on_output = collector()
    launcher = Launcher([PY, "-c", AFFINITY], repeat_hosts=2, on_output=on_output, verbose=True).start()
    assert launcher.wait(30) == 0
    cpus = {r: json.loads(line) for r, s, line in out if s == "stdout"}
    assert not set(cpus[0]) & set(cpus[1])
    logs = capfd.readouterr().err.splitlines()
    assert any("rank 0 on" in line and "bound to cpu" in line for line in logs), logs


def test_api_and_cluster_refuse_an_unknown_policy_by_name():
    from mlx_jupyter import Cluster

    with pytest.raises(ValueError, match="bind_to 'socket': choose one of cores, none"):
        Launcher([PY, "-c", "pass"], bind_to="socket")
    with pytest.raises(ValueError, match="bind_to 'socket'"):
        Cluster(n=2, bind_to="socket")


@needs_affinity
@two_cpus
def test_cluster_ranks_are_bound_unless_told_not_to():
    from mlx_jupyter import Cluster

    every = binding.allowed_cpus()
    for policy in ("cores", "none"):
        with Cluster(n=2, bind_to=policy, timeout=60) as cluster:
            cluster.view.execute("import os; cpus = sorted(os.sched_getaffinity(0))", block=True)
            got = cluster.pull("cpus")
        if policy == "none":
            assert got == [every, every]
        else:
            assert got[0] and got[1] and not set(got[0]) & set(got[1]), got
