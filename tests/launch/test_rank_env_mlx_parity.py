"""The backends' environment as MLX reads it today: JACCL's two names (JACCL_* wins), a launch without a
coordinator, MLX_NCCL_TIMEOUT from our connect timeout, --verbose's variables."""

from __future__ import annotations

import json

import pytest

from mlx_jupyter.hostfile import Host, parse_host_list
from mlx_jupyter.vocab import rank_env
from mlx_jupyter.launch.contract import ContractError, nccl_timeout_ms, plan_ranks
from mlx_jupyter.vocab.rank_env import read


def test_jaccl_reads_both_names_and_the_jaccl_one_wins() -> None:
    both = {"JACCL_IBV_DEVICES": "/a.json", "MLX_IBV_DEVICES": "/b.json", "JACCL_COORDINATOR": "10.0.0.1:1",
            "MLX_JACCL_COORDINATOR": "10.0.0.2:2", "JACCL_RANK": "1", "MLX_RANK": "0", "JACCL_RING": "1"}
    env = read(both)
    assert (env.jaccl.devices, env.jaccl.devices_var) == ("/a.json", "JACCL_IBV_DEVICES")
    assert (env.jaccl.coordinator, env.jaccl.coordinator_var) == ("10.0.0.1:1", "JACCL_COORDINATOR")
    assert env.rank == 1 and env.process_rank == 1 and env.jaccl.ring
    mlx_only = read({"MLX_IBV_DEVICES": "/b.json", "MLX_JACCL_COORDINATOR": "10.0.0.2:2", "MLX_RANK": "2",
                     "MLX_JACCL_RING": "1"})
    assert (mlx_only.jaccl.devices, mlx_only.jaccl.coordinator, mlx_only.rank) == ("/b.json", "10.0.0.2:2", 2)
    assert mlx_only.jaccl.ring and not read({}).jaccl.configured
    with pytest.raises(rank_env.RankEnvError, match="JACCL_RANK='x'"):
        read({"JACCL_RANK": "x", "MLX_RANK": "0"})


def test_a_jaccl_launch_without_a_coordinator_is_still_a_jaccl_launch() -> None:
    env = read({"JACCL_IBV_DEVICES": "/a.json", "JACCL_RANK": "1"})
    assert env.launchers == ("jaccl",) and not env.jaccl.coordinator
    # a JACCL rank that cannot form its group is an error, never a silent group of one
    assert env.launched and read({"MLX_IBV_DEVICES": "/a.json"}).launched and read({"JACCL_RANK": "0"}).launched


def mesh(n: int) -> list[Host]:
    return [Host(f"m{i}", (f"10.0.0.{i + 1}",), tuple(None if j == i else f"rdma_en{j}" for j in range(n)))
            for i in range(n)]


def test_a_cluster_plans_jaccl_over_our_core_without_a_coordinator_port() -> None:
    plans = plan_ranks("jaccl", mesh(3), token="t", starting_port=30000, coordinator=False)
    for p in plans:
        assert rank_env.JACCL_COORDINATOR not in p.env and "MLX_IBV_DEVICES" in p.files
        core = json.loads(p.files[rank_env.OWN_HOSTFILE])
        assert core == [[f"10.0.0.{r + 1}:{31000 + r}"] for r in range(3)]   # MLX's ports + the core's offset
        env = read({**p.env, "MLX_IBV_DEVICES": "/d.json", rank_env.OWN_HOSTFILE: "/core.json"})
        assert env.launchers == ("jaccl",) and env.hostfile == "/core.json" and env.port_offset == 0
    # mlx-jupyter launch keeps MLX's coordinator (scripts written for mlx.launch call init without a factory)
    assert all(p.env[rank_env.JACCL_COORDINATOR] == "10.0.0.1:30000" for p in plan_ranks("jaccl", mesh(3), starting_port=30000))
    # a host without an IP: no core ring, so the coordinator after all
    no_ip = [Host("m0", ("10.0.0.1",), (None, "rdma_en1")), Host("m1", (), ("rdma_en0", None))]
    plans = plan_ranks("jaccl", no_ip, coordinator=False)
    assert rank_env.OWN_HOSTFILE not in plans[0].files and plans[0].env[rank_env.JACCL_COORDINATOR]


def test_nccl_timeout_follows_our_connect_timeout() -> None:
    plans = plan_ranks("nccl", parse_host_list("127.0.0.1", 2))
    assert plans[0].env[rank_env.NCCL_TIMEOUT] == "120000"
    plans = plan_ranks("nccl", parse_host_list("127.0.0.1", 2), env={rank_env.CONNECT_TIMEOUT: "7.5"})
    assert plans[1].env[rank_env.NCCL_TIMEOUT] == "7500"
    plans = plan_ranks("nccl", parse_host_list("127.0.0.1", 2), env={rank_env.NCCL_TIMEOUT: "5"})
    assert plans[0].env[rank_env.NCCL_TIMEOUT] == "5"                  # an explicit value wins
    assert nccl_timeout_ms("-1") == nccl_timeout_ms("inf") == str(2**31 - 1)
    with pytest.raises(ContractError, match="MLX_JUPYTER_CONNECT_TIMEOUT='soon'"):
        nccl_timeout_ms("soon")


def test_verbose_sets_what_mlx_launch_sets() -> None:
    hosts = parse_host_list("127.0.0.1", 2)
    assert all(p.env["MLX_RING_VERBOSE"] == "1" for p in plan_ranks("ring", hosts, verbose=True))
    assert all(p.env["NCCL_DEBUG"] == "INFO" for p in plan_ranks("nccl", hosts, verbose=True))
    assert all("MLX_RING_VERBOSE" not in p.env for p in plan_ranks("ring", hosts))
    assert all("NCCL_DEBUG" not in p.env for p in plan_ranks("nccl", hosts))
