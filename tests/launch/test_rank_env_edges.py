"""The rank's environment read at the edges: each range's bounds, which variable wins, what counts as a launch."""

from __future__ import annotations

import math

import pytest

from mlx_jupyter.vocab import rank_env
from mlx_jupyter.vocab.rank_env import RankEnvError, check_seconds, first_set, load_ring, read, variables


@pytest.mark.parametrize("var, ok, bad", [
    (rank_env.SIZE, ["1", str(1 << 20)], ["0", str((1 << 20) + 1)]),
    (rank_env.CELL_PORT, ["0", "65535"], ["-1", "65536"]),
    (rank_env.PORT_OFFSET, ["-65535", "65535"], ["-65536", "65536"]),
    ("OMPI_COMM_WORLD_RANK", ["0", str(1 << 30)], ["-1", str((1 << 30) + 1)]),
])
def test_integer_ranges_hold_at_both_ends(var, ok, bad):
    for text in ok:
        read({var: text})
    lo, hi = {rank_env.SIZE: (1, 1 << 20), rank_env.CELL_PORT: (0, 65535), rank_env.PORT_OFFSET: (-65535, 65535),
              "OMPI_COMM_WORLD_RANK": (0, 1 << 30)}[var]
    for text in bad:
        with pytest.raises(RankEnvError) as info:
            read({var: text})
        assert str(info.value) == f"{var}={text} is outside {lo}..{hi}; set one in that range, or unset it"
    with pytest.raises(RankEnvError) as info:
        read({var: " 1x "})
    assert str(info.value) == f"{var}='1x' is not an integer; set one in {lo}..{hi}, or unset it"


def test_values_read():
    env = read({rank_env.SIZE: " 3 ", rank_env.CELL_PORT: "0", rank_env.PORT_OFFSET: "-5", rank_env.TIMEOUT: "2.5",
                rank_env.CONNECT_TIMEOUT: "7", rank_env.DEAD_PEER_TIMEOUT: "86400", rank_env.TRANSPORT: "tcp",
                rank_env.SHM: "named", rank_env.BOARD: "0", rank_env.EARLY_WORLD: "1", rank_env.HOST_ID: "h",
                rank_env.BACKEND: "ring", rank_env.TOKEN: "t", rank_env.MPI_LIBNAME: "libmpi.so"})
    assert (env.size, env.cell_port, env.port_offset, env.timeout, env.connect_timeout, env.dead_peer_timeout) == \
        (3, None, -5, 2.5, 7.0, 86400.0)
    assert (env.transport, env.shm, env.board, env.early_world, env.host_id, env.backend, env.token, env.mpi_libname) == \
        ("tcp", "named", False, True, "h", "ring", "t", "libmpi.so")
    default = read({})
    assert (default.size, default.cell_port, default.port_offset, default.timeout, default.connect_timeout,
            default.dead_peer_timeout, default.transport, default.shm, default.board, default.early_world) == \
        (1, None, None, -1.0, 120.0, 10.0, "auto", "auto", True, True)  # offset: from the hostfile
    assert read({rank_env.CELL_PORT: "65535"}).cell_port == 65535


@pytest.mark.parametrize("text", ["0", "-1", "86400.5"])
def test_dead_peer_timeout_is_in_0_to_a_day(text):
    with pytest.raises(RankEnvError, match=rf"^MLX_JUPYTER_DEAD_PEER_TIMEOUT={text!r} must be a number of seconds in "
                                           r"\(0, 86400\]; unset it for the default \(10\)$"):
        read({rank_env.DEAD_PEER_TIMEOUT: text})


def test_the_timeout_rule_at_its_edges():
    assert check_seconds(0, "t") == 0.0 and check_seconds(-1, "t") == -1.0 and check_seconds(math.inf, "t") == math.inf
    for bad in (-1.0000001, -0.0001, -2, math.nan):
        with pytest.raises(ValueError, match=r"^t must be >= 0 seconds \(or -1 to wait\), got "):
            check_seconds(bad, "t")


def test_which_rank_variable_wins():
    assert read({rank_env.JACCL_RANK: "2", rank_env.RANK: "5"}).rank == 2
    assert read({rank_env.RANK: "5"}).rank == 5 and read({}).rank is None
    with pytest.raises(RankEnvError, match=r"^JACCL_RANK='' is not an integer; set this process's 0-based rank$"):
        read({rank_env.JACCL_RANK: "", rank_env.RANK: "5"})
    assert read({"PMI_RANK": "3", "SLURM_PROCID": "4"}).process_rank == 3
    assert read({"OMPI_COMM_WORLD_RANK": "", "SLURM_PROCID": "4"}).process_rank == 4
    assert read({rank_env.RANK: "1", "SLURM_PROCID": "4"}).process_rank == 1 and read({}).process_rank == 0
    assert first_set({"b": "", "a": "1"}, ("b", "a")) == ("b", "") and first_set({}, ("a",)) == ("", "")


def test_what_counts_as_a_launch_and_which_launchers_are_there():
    assert [read(e).launched for e in ({rank_env.RANK: "0"}, {rank_env.HOSTFILE: "h"}, {rank_env.JACCL_RANK: "0"},
                                       {"JACCL_IBV_DEVICES": "d"}, {"MLX_IBV_DEVICES": "d"}, {"SLURM_PROCID": "0"},
                                       {"MLX_JACCL_COORDINATOR": "1.2.3.4:5"})] == [True] * 5 + [False] * 2
    nccl = {rank_env.WORLD_SIZE: "2", rank_env.NCCL_HOST_IP: "10.0.0.1"}
    assert read(nccl).launchers == ("nccl",)
    assert read({rank_env.WORLD_SIZE: "2"}).launchers == () and read({rank_env.NCCL_HOST_IP: "x"}).launchers == ()
    assert read({"OMPI_COMM_WORLD_SIZE": "2"}).launchers == ("mpi",) and read({"PMI_SIZE": "x"}).launchers == ("mpi",)
    assert read({"OMPI_COMM_WORLD_SIZE": "1", "PMI_SIZE": "4"}).launchers == ()
    assert read({"OMPI_COMM_WORLD_SIZE": " ", "PMI_SIZE": "4"}).launchers == ("mpi",)
    jaccl = {"JACCL_COORDINATOR": "10.0.0.1:5", "MLX_JACCL_COORDINATOR": "10.0.0.2:5", "MLX_IBV_DEVICES": "m.json",
             "MLX_JACCL_RING": "1"}
    j = read({**nccl, "OMPI_COMM_WORLD_SIZE": "3", **jaccl})
    assert j.launchers == ("nccl", "mpi", "jaccl")
    assert (j.jaccl.devices, j.jaccl.devices_var, j.jaccl.coordinator, j.jaccl.coordinator_var, j.jaccl.ring) == \
        ("m.json", "MLX_IBV_DEVICES", "10.0.0.1:5", "JACCL_COORDINATOR", True)
    assert read({"JACCL_IBV_DEVICES": "", "MLX_IBV_DEVICES": "m"}).jaccl.devices_var == ""
    assert read({"JACCL_RING": ""}).jaccl.ring is True and read({}).jaccl.ring is False
    assert read({"JACCL_COORDINATOR": "c"}).launchers == ("jaccl",) and not read({}).jaccl.configured


def test_hostfiles_and_verbosity():
    mlx = read({rank_env.HOSTFILE: "m.json", rank_env.PORT_OFFSET: "7"})
    assert (mlx.hostfile, mlx.hostfile_var, mlx.port_offset, mlx.mlx_hostfile) == ("m.json", "MLX_HOSTFILE", 7, "m.json")
    own = read({rank_env.OWN_HOSTFILE: "o.json", rank_env.HOSTFILE: "m.json", rank_env.PORT_OFFSET: "7"})
    assert (own.hostfile, own.hostfile_var, own.port_offset, own.mlx_hostfile) == ("o.json", "MLX_JUPYTER_HOSTFILE", 0, "m.json")
    assert read({rank_env.PORT_OFFSET: "0"}).port_offset == 0
    assert read({"MLX_RING_VERBOSE": "1"}).verbose and read({"MLX_JUPYTER_VERBOSE": "1"}).verbose and not read({}).verbose
    assert read({rank_env.RANK: "0"}).ring_configured and read({rank_env.HOSTFILE: "h"}).ring_configured
    assert not read({}).ring_configured


def test_variables_writes_what_read_reads_and_refuses_other_names():
    assert variables(board=False, early_world=True, cell_port=None, timeout=2.5, token="t") == {
        "MLX_JUPYTER_BOARD": "0", "MLX_JUPYTER_EARLY_WORLD": "1", "MLX_JUPYTER_CELL_PORT": "0",
        "MLX_JUPYTER_TIMEOUT": "2.5", "MLX_JUPYTER_TOKEN": "t"}
    with pytest.raises(TypeError, match=r"^\['rank'\]: not written by launchers; writable are backend, board, "):
        variables(rank=1)
    with pytest.raises(TypeError, match=r"^\['nope'\]: not RankEnv fields; writable are"):
        variables(nope=1)


def test_load_ring_each_refusal_and_the_offset():
    files = {"h.json": '[["10.0.0.1:5000"], ["10.0.0.2:65000"]]'}
    ring = load_ring(read({rank_env.HOSTFILE: "h.json", rank_env.RANK: "1", rank_env.PORT_OFFSET: "535"}), files.__getitem__)
    assert ring.rank == 1 and ring.addresses == [[("10.0.0.1", 5535)], [("10.0.0.2", 65535)]]
    assert ring.source == "MLX_HOSTFILE=h.json"
    assert load_ring(read({})) is None
    single = load_ring(read({rank_env.RANK: "0"}))
    assert (single.rank, single.addresses, single.source) == (0, [[]], "MLX_RANK=0 without a hostfile (a single rank)")
    refusals = [
        ({rank_env.HOSTFILE: "h.json"}, "MLX_HOSTFILE is set but MLX_RANK is not: set MLX_RANK to this process's 0-based rank"),
        ({rank_env.RANK: "1"}, "MLX_RANK=1 but MLX_HOSTFILE is not set: point it at the ring hostfile"),
        ({rank_env.HOSTFILE: "h.json", rank_env.RANK: "2"}, "MLX_RANK=2 is out of range: h.json lists 2 rank(s), 0..1"),
        ({rank_env.HOSTFILE: "h.json", rank_env.RANK: "0", rank_env.PORT_OFFSET: "536"},
         "h.json: rank 1 port 65000 + MLX_JUPYTER_PORT_OFFSET 536 is outside 1..65535; choose another offset or starting port"),
        ({rank_env.HOSTFILE: "h.json", rank_env.RANK: "0", rank_env.PORT_OFFSET: "-5000"},
         "h.json: rank 0 port 5000 + MLX_JUPYTER_PORT_OFFSET -5000 is outside 1..65535; choose another offset or starting port"),
    ]
    for env, why in refusals:
        with pytest.raises(RankEnvError) as info:
            load_ring(read(env), files.__getitem__)
        assert str(info.value) == why
    assert load_ring(read({rank_env.HOSTFILE: "h.json", rank_env.RANK: "0", rank_env.PORT_OFFSET: "-4999"}),
                     files.__getitem__).addresses[0] == [("10.0.0.1", 1)]
    # unset: +1000, or -1000 where +1000 lands among outgoing connections' ports (MLX's default 32323 does)
    files |= {"d.json": '[["10.0.0.1:32323"], ["10.0.0.2:32324"]]', "e.json": '[["10.0.0.1:5000"], ["10.0.0.2:5001"]]'}
    assert load_ring(read({rank_env.HOSTFILE: "d.json", rank_env.RANK: "0"}), files.__getitem__).addresses == \
        [[("10.0.0.1", 31323)], [("10.0.0.2", 31324)]]
    assert load_ring(read({rank_env.HOSTFILE: "e.json", rank_env.RANK: "0"}), files.__getitem__).addresses == \
        [[("10.0.0.1", 6000)], [("10.0.0.2", 6001)]]
    assert load_ring(read({rank_env.HOSTFILE: "d.json", rank_env.RANK: "0", rank_env.PORT_OFFSET: "1000"}),
                     files.__getitem__).addresses[0] == [("10.0.0.1", 33323)]   # set: as set

    def unreadable(path: str) -> str:
        raise FileNotFoundError(2, "No such file or directory")
    with pytest.raises(RankEnvError, match=r"^MLX_JUPYTER_HOSTFILE=o.json: cannot read the hostfile \(No such file or directory\)$"):
        load_ring(read({rank_env.OWN_HOSTFILE: "o.json", rank_env.RANK: "0"}), unreadable)


def test_more_edges_of_the_readers():
    assert read({"OMPI_COMM_WORLD_RANK": " ", "SLURM_PROCID": "4"}).process_rank == 0   # the first one set wins
    assert read({"PMI_RANK": "0", "SLURM_PROCID": "4"}).process_rank == 0
    assert read({"JACCL_COORDINATOR": "", "MLX_JACCL_COORDINATOR": "x"}).jaccl.coordinator_var == ""
    with pytest.raises(RankEnvError) as info:
        read({rank_env.TRANSPORT: "udp"})
    assert str(info.value) == "MLX_JUPYTER_TRANSPORT='udp' is not one of auto, tcp; set one of them, or unset it"


@pytest.mark.parametrize("text, why", [
    ("[1,", "hf.json is not valid JSON (Expecting value at line 1 column 4); expected a list with one list of "
            "\"ip:port\" strings per rank"),
    ("[]", "hf.json: expected a non-empty JSON list with one entry per rank, got []"),
    ("0", "hf.json: expected a non-empty JSON list with one entry per rank, got 0"),
    ('{"a": 1}', "hf.json: expected a non-empty JSON list with one entry per rank, got 'dict'"),
    ('"x"', "hf.json: expected a non-empty JSON list with one entry per rank, got 'str'"),
    ('[["10.0.0.1:5"], []]', "hf.json: entry 1 (rank 1) must be a non-empty list of \"ip:port\" strings"),
    ('[["10.0.0.1:0"]]', "hf.json: rank 0: '10.0.0.1:0' has no valid port (a number in 1..65535 after the last ':')"),
])
def test_ring_hostfile_refusals(text, why):
    with pytest.raises(RankEnvError) as info:
        rank_env.parse_ring_hostfile(text, "hf.json")
    assert str(info.value) == why


def test_a_ring_hostfile_entry_may_be_one_string_and_a_bad_file_is_named(tmp_path):
    assert rank_env.parse_ring_hostfile('["10.0.0.1:5", ["10.0.0.2:6"]]', "hf") == [[("10.0.0.1", 5)], [("10.0.0.2", 6)]]
    bad = tmp_path / "ring.json"
    bad.write_text("[]", encoding="utf-8")
    with pytest.raises(RankEnvError, match=rf"^{bad}: expected a non-empty JSON list"):
        load_ring(read({rank_env.HOSTFILE: str(bad), rank_env.RANK: "0"}))


def test_current_reads_this_process_environment(monkeypatch):
    monkeypatch.setenv(rank_env.SIZE, "3")
    assert rank_env.current().size == 3
