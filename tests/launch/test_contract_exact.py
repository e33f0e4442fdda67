"""The per-backend contract, whole: every variable and file each rank gets, and each refusal's words."""

from __future__ import annotations

import json

import pytest

from mlx_jupyter.hostfile import Host
from mlx_jupyter.launch.contract import ContractError, check_rdma, nccl_timeout_ms, plan_mpi, plan_ranks

A, B = Host("a", ["10.0.0.1"]), Host("b", ["10.0.0.2"])


def _mesh(n: int) -> list[Host]:
    return [Host(f"m{i}", [f"10.0.1.{i}"], [None if j == i else f"rdma_en{j}" for j in range(n)]) for i in range(n)]


def test_ring_gives_each_rank_the_whole_plan_and_its_rank():
    plans = plan_ranks("ring", [A, B], env={"X": "1"}, token="t", starting_port=5000, connections_per_ip=2,
                       verbose=True)
    ring = json.dumps([["10.0.0.1:5000", "10.0.0.1:5001"], ["10.0.0.2:5002", "10.0.0.2:5003"]])
    assert [(p.rank, p.host, p.env, p.files) for p in plans] == [
        (r, h, {"X": "1", "MLX_JUPYTER_TOKEN": "t", "MLX_RING_VERBOSE": "1", "MLX_RANK": str(r)}, {"MLX_HOSTFILE": ring})
        for r, h in enumerate([A, B])]
    assert plan_ranks("ring", [A])[0].env == {"MLX_RANK": "0"}


def test_ring_refusals_name_the_backend():
    with pytest.raises(ContractError, match=r"^ring: --connections-per-ip must be > 0, got 0$"):
        plan_ranks("ring", [A, B], connections_per_ip=0)
    with pytest.raises(ContractError, match=r"^no hosts to launch on$"):
        plan_ranks("ring", [])
    with pytest.raises(ContractError, match=r"^backend 'mpi': plan_ranks handles ring, jaccl, jaccl-ring, nccl "
                                            r"\(mpi goes through plan_mpi\)$"):
        plan_ranks("mpi", [A])
    with pytest.raises(ContractError, match=r"^backend 'gloo': plan_ranks handles"):
        plan_ranks("gloo", [A])


@pytest.mark.parametrize("coordinator", [True, False])
def test_jaccl_gives_the_device_matrix_and_the_core_ring(coordinator):
    hosts = _mesh(2)
    plans = plan_ranks("jaccl-ring", hosts, starting_port=6000, coordinator=coordinator)
    common = {"MLX_JACCL_RING": "1", **({"MLX_JACCL_COORDINATOR": "10.0.1.0:6000"} if coordinator else {})}
    files = {"MLX_IBV_DEVICES": json.dumps([[None, "rdma_en1"], ["rdma_en0", None]]),
             "MLX_JUPYTER_HOSTFILE": json.dumps([["10.0.1.0:7000"], ["10.0.1.1:7001"]])}
    assert [(p.env, p.files) for p in plans] == [({**common, "MLX_RANK": str(r)}, files) for r in range(2)]


def test_jaccl_without_an_ip_on_a_host_keeps_the_coordinator_and_has_no_core_ring():
    hosts = _mesh(2)
    hosts[1] = Host("m1", [], hosts[1].rdma)
    (p0, _) = plan_ranks("jaccl", hosts, starting_port=6000, coordinator=False)
    assert p0.env == {"MLX_JACCL_COORDINATOR": "10.0.1.0:6000", "MLX_RANK": "0"}
    assert set(p0.files) == {"MLX_IBV_DEVICES"}
    (only,) = plan_ranks("jaccl", [Host("m0", ["10.0.1.0"])], coordinator=False)
    assert only.env == {"MLX_RANK": "0"} and only.files == {"MLX_IBV_DEVICES": "[[null]]"}
    with pytest.raises(ContractError, match=r"^jaccl: rank 0 \(host 'm0'\) needs an IP that every rank can reach; "
                                            r"add \"ips\" to its hostfile entry or list it by IP$"):
        plan_ranks("jaccl", [Host("m0")])


def test_check_rdma_says_which_host_and_pair():
    with pytest.raises(ContractError, match=r"^jaccl runs one rank per host: a host is listed twice"):
        check_rdma([Host("m0", rdma=[None, "x"]), Host("m0", rdma=["x", None])], False)
    with pytest.raises(ContractError, match=r"^jaccl: host 'm1' \(rank 1\) lists 1 RDMA devices in 'rdma' but there "
                                            r"are 2 hosts; it needs one entry per host \(null for itself\)$"):
        check_rdma([Host("m0", rdma=[None, "x"]), Host("m1", rdma=["x"])], False)
    with pytest.raises(ContractError, match=r"^jaccl: host 'm1' \(rank 1\): rdma\[1\] must be null"):
        check_rdma([Host("m0", rdma=[None, "x"]), Host("m1", rdma=["x", "y"])], False)
    six = [Host(f"m{i}", rdma=[None] * 6) for i in range(6)]
    with pytest.raises(ContractError, match=r"^jaccl: no RDMA device listed for m0 -> m1, m0 -> m5, m1 -> m0, m1 -> m2 "
                                            r"and 8 more; run `mlx-jupyter config`"):
        check_rdma(six, True)   # a ring needs each host's two neighbours: 12 pairs
    with pytest.raises(ContractError, match=r"for m0 -> m1, m0 -> m2, m0 -> m3, m0 -> m4 and 26 more;"):
        check_rdma(six, False)   # a mesh needs every pair: 30
    four = [Host(f"m{i}", rdma=[None] * 4) for i in range(4)]
    for h in four[:3]:
        h.rdma[:] = [None if j == int(h.ssh[1]) else "d" for j in range(4)]
    with pytest.raises(ContractError, match=r"for m3 -> m0, m3 -> m1, m3 -> m2; run"):
        check_rdma(four, False)   # four missing: no "and N more"
    assert check_rdma(_mesh(3), False) == [h.rdma for h in _mesh(3)]


def test_nccl_gives_rank_0s_ip_the_size_and_a_gpu_per_local_rank():
    plans = plan_ranks("nccl", [A, A, B], env={"MLX_JUPYTER_CONNECT_TIMEOUT": "2.5", "NCCL_DEBUG": "WARN"},
                       nccl_port=777, verbose=True)
    common = {"MLX_JUPYTER_CONNECT_TIMEOUT": "2.5", "NCCL_DEBUG": "WARN", "NCCL_HOST_IP": "10.0.0.1",
              "NCCL_PORT": "777", "MLX_WORLD_SIZE": "3", "MLX_NCCL_TIMEOUT": "2500"}
    assert [(p.env, p.files) for p in plans] == [
        ({**common, "CUDA_VISIBLE_DEVICES": gpu, "MLX_RANK": str(r)}, {}) for r, gpu in enumerate("010")]
    assert plan_ranks("nccl", [A], verbose=True)[0].env["NCCL_DEBUG"] == "INFO"
    assert "NCCL_DEBUG" not in plan_ranks("nccl", [A])[0].env
    assert plan_ranks("nccl", [A], env={"MLX_NCCL_TIMEOUT": "5"})[0].env["MLX_NCCL_TIMEOUT"] == "5"
    assert plan_ranks("nccl", [A])[0].env["MLX_NCCL_TIMEOUT"] == "120000"


@pytest.mark.parametrize("text, ms", [
    (None, "120000"), ("", "120000"), ("0", "1"), ("0.0004", "1"), ("2.5", "2500"), ("2147483.646", "2147483646"),
    ("2147483.647", "2147483647"), ("1e12", "2147483647"), ("-1", "2147483647"), ("inf", "2147483647"),
    ("nan", "2147483647"),
])
def test_nccl_timeout_in_ms_up_to_the_largest_int_which_means_wait(text, ms):
    assert nccl_timeout_ms(text) == ms


def test_nccl_timeout_refuses_a_non_number_naming_the_variable():
    with pytest.raises(ContractError, match=r"^MLX_JUPYTER_CONNECT_TIMEOUT='soon' is not a number of seconds$"):
        nccl_timeout_ms("soon")


def test_mpi_plan_whole():
    hosts = [Host("127.0.0.1"), Host("localhost"), Host("ann@b"), Host("c"), Host("ann@b")]
    plan = plan_mpi(hosts, env={"X": "1", "LD_LIBRARY_PATH": "/lib:/opt/mpi/lib::/usr/lib"}, token="t",
                    libname="libmpi.so.40", libdir="/opt/mpi/lib", inherited={"LD_LIBRARY_PATH": "/ignored"})
    assert plan.hostfile == "localhost slots=2\nann@b slots=2\nc slots=1\n" and plan.size == 5
    assert plan.rank_hosts == ["localhost", "localhost", "ann@b", "ann@b", "c"]
    assert plan.env == {"MLX_MPI_LIBNAME": "libmpi.so.40", "X": "1", "LD_LIBRARY_PATH": "/opt/mpi/lib:/lib:/usr/lib",
                        "MLX_JUPYTER_TOKEN": "t"}
    mac = plan_mpi([Host("c")], libdir="/m", darwin=True, inherited={"DYLD_LIBRARY_PATH": "/x:/m", "LD_LIBRARY_PATH": "/l"})
    assert mac.env == {"DYLD_LIBRARY_PATH": "/m:/x"}
    assert plan_mpi([Host("c")], libdir="/m").env == {"LD_LIBRARY_PATH": "/m"}
    assert plan_mpi([Host("c")]).env == {}
    with pytest.raises(ContractError, match=r"^no hosts to launch on$"):
        plan_mpi([])


def test_jaccl_core_ring_follows_connections_and_is_dropped_past_port_65535():
    hosts = _mesh(2)
    (p0, _) = plan_ranks("jaccl", hosts, starting_port=6000, connections_per_ip=2)
    assert json.loads(p0.files["MLX_JUPYTER_HOSTFILE"]) == [["10.0.1.0:7000", "10.0.1.0:7001"],
                                                             ["10.0.1.1:7002", "10.0.1.1:7003"]]
    (p0, _) = plan_ranks("jaccl", hosts, coordinator=False)   # MLX's default 32323: ours below it, clear of
    assert json.loads(p0.files["MLX_JUPYTER_HOSTFILE"]) == [["10.0.1.0:31323"], ["10.0.1.1:31324"]]  # outgoing ports
    (p0, _) = plan_ranks("jaccl", hosts, starting_port=31767, coordinator=False)   # +1000: 32767 and 32768
    assert json.loads(p0.files["MLX_JUPYTER_HOSTFILE"]) == [["10.0.1.0:30767"], ["10.0.1.1:30768"]]
    (p0, _) = plan_ranks("jaccl", hosts, starting_port=63600, coordinator=False)   # 64600.. +1000 leaves 1..65535
    assert set(p0.files) == {"MLX_IBV_DEVICES"} and p0.env["MLX_JACCL_COORDINATOR"] == "10.0.1.0:63600"


def test_missing_rdma_pairs_say_and_n_more_only_past_four():
    def missing(k: int) -> str:   # host 0 of a 6-host mesh lacks k of its devices
        hosts = _mesh(6)
        for j in range(1, k + 1):
            hosts[0].rdma[j] = None
        with pytest.raises(ContractError) as info:
            check_rdma(hosts, False)
        return str(info.value)
    assert missing(4).startswith("jaccl: no RDMA device listed for m0 -> m1, m0 -> m2, m0 -> m3, m0 -> m4; run")
    assert "m0 -> m4 and 1 more; run" in missing(5)


def test_nccl_port_default_is_mlxs():
    assert plan_ranks("nccl", [A])[0].env["NCCL_PORT"] == "12345"
