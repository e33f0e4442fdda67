"""The per-backend environment contract (pure)."""

from __future__ import annotations

import json

import pytest

from mlx_jupyter.launch.contract import ContractError, check_rdma, plan_mpi, plan_ranks
from mlx_jupyter.hostfile import Host, parse_host_list


def mesh(n: int) -> list[Host]:
    return [Host(f"m{i}", [f"10.0.0.{i + 1}"], [None if j == i else f"rdma_en{j}" for j in range(n)]) for i in range(n)]


def test_ring_env_and_hostfile():
    hosts = parse_host_list("10.0.0.1,10.0.0.2", 2)
    plans = plan_ranks("ring", hosts, env={"A": "1", "MLX_RANK": "99"}, token="t0k", starting_port=4000)
    assert [p.env["MLX_RANK"] for p in plans] == ["0", "1", "2", "3"]  # the contract wins over user env
    assert all(p.env["A"] == "1" and p.env["MLX_JUPYTER_TOKEN"] == "t0k" for p in plans)
    ring = json.loads(plans[0].files["MLX_HOSTFILE"])
    assert ring == [["10.0.0.1:4000"], ["10.0.0.1:4001"], ["10.0.0.2:4002"], ["10.0.0.2:4003"]]
    assert "MLX_RING_VERBOSE" not in plans[0].env
    assert plan_ranks("ring", hosts, verbose=True)[0].env["MLX_RING_VERBOSE"] == "1"


def test_one_rank_ring_has_no_hostfile():
    (plan,) = plan_ranks("ring", parse_host_list("127.0.0.1"))
    assert plan.files == {} and plan.env["MLX_RANK"] == "0" and "MLX_HOSTFILE" not in plan.env


def test_ring_refuses_hostnames():
    with pytest.raises(ContractError, match="no IP.*hostfile"):
        plan_ranks("ring", parse_host_list("mac-1,mac-2"))


def test_jaccl_env_and_device_matrix():
    plans = plan_ranks("jaccl", mesh(3), starting_port=5555)
    assert all(p.env["MLX_JACCL_COORDINATOR"] == "10.0.0.1:5555" for p in plans)
    assert "MLX_JACCL_RING" not in plans[0].env
    assert json.loads(plans[2].files["MLX_IBV_DEVICES"]) == [h.rdma for h in mesh(3)]


def test_jaccl_ring_needs_only_neighbours():
    hosts = mesh(4)
    hosts[0].rdma[2] = None  # 0 and 2 are not ring neighbours
    hosts[2].rdma[0] = None
    with pytest.raises(ContractError, match="m0 -> m2"):
        plan_ranks("jaccl", hosts)
    plans = plan_ranks("jaccl-ring", hosts)
    assert plans[1].env["MLX_JACCL_RING"] == "1"


@pytest.mark.parametrize("mutate, match", [
    (lambda h: h[1].rdma.pop(), "lists 2 RDMA devices"),
    (lambda h: h[1].rdma.__setitem__(1, "rdma_en1"), r"rdma\[1\] must be null"),
    (lambda h: h[0].ips.clear(), "rank 0 .* needs an IP"),
    (lambda h: h.append(Host("m0", ["10.0.0.9"], [None] * 4)), "listed twice"),
])
def test_jaccl_malformed(mutate, match):
    hosts = mesh(3)
    mutate(hosts)
    with pytest.raises(ContractError, match=match):
        plan_ranks("jaccl", hosts)


def test_check_rdma_accepts_lists_of_devices():
    hosts = mesh(2)
    hosts[0].rdma[1] = ["rdma_en1", "rdma_en2"]
    assert check_rdma(hosts, ring=False)[0][1] == ["rdma_en1", "rdma_en2"]


def test_nccl_env():
    hosts = parse_host_list("10.0.0.1,10.0.0.2", 2)
    plans = plan_ranks("nccl", hosts, nccl_port=777, env={"NCCL_IB_DISABLE": "1"}, verbose=True)
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in plans] == ["0", "1", "0", "1"]
    for p in plans:
        assert p.env["NCCL_HOST_IP"] == "10.0.0.1" and p.env["NCCL_PORT"] == "777"
        assert p.env["MLX_WORLD_SIZE"] == "4" and p.env["NCCL_IB_DISABLE"] == "1" and p.env["NCCL_DEBUG"] == "INFO"
        assert p.files == {}


def test_nccl_needs_rank0_ip():
    with pytest.raises(ContractError, match="nccl: rank 0"):
        plan_ranks("nccl", parse_host_list("gpu1,10.0.0.2"))


def test_unknown_backend():
    with pytest.raises(ContractError, match="ring, jaccl, jaccl-ring, nccl"):
        plan_ranks("tcp", parse_host_list("127.0.0.1"))


def test_mpi_plan():
    hosts = parse_host_list("127.0.0.1", 2) + parse_host_list("root@h2,h3,root@h2")
    plan = plan_mpi(hosts, env={"A": "1"}, token="t", libname="libmpi.so.40", libdir="/usr/lib")
    assert plan.hostfile == "localhost slots=2\nroot@h2 slots=2\nh3 slots=1\n"   # user@ kept for mpirun's ssh
    assert plan.size == 5
    assert plan.rank_hosts == ["localhost", "localhost", "root@h2", "root@h2", "h3"]
    assert plan.env == {"MLX_MPI_LIBNAME": "libmpi.so.40", "LD_LIBRARY_PATH": "/usr/lib", "A": "1",
                        "MLX_JUPYTER_TOKEN": "t"}
    assert "DYLD_LIBRARY_PATH" in plan_mpi(hosts, libdir="/opt/lib", darwin=True).env


def test_mpi_plan_prepends_the_library_path():
    hosts = parse_host_list("h1")
    assert plan_mpi(hosts, libdir="/mpi", inherited={"LD_LIBRARY_PATH": "/a:/b"}).env["LD_LIBRARY_PATH"] == "/mpi:/a:/b"
    env = plan_mpi(hosts, env={"LD_LIBRARY_PATH": "/mine"}, libdir="/mpi", inherited={"LD_LIBRARY_PATH": "/a"}).env
    assert env["LD_LIBRARY_PATH"] == "/mpi:/mine"   # the user's value wins over the inherited one, after libdir
    assert plan_mpi(hosts, libdir="/mpi", inherited={"LD_LIBRARY_PATH": "/mpi:/x"}).env["LD_LIBRARY_PATH"] == "/mpi:/x"
    assert plan_mpi(hosts, libdir="/mpi").env["LD_LIBRARY_PATH"] == "/mpi"
