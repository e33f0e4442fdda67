"""The rank's environment, both ways: what launchers write is what a rank reads, every bad value
is an error naming the variable, and the ring hostfile is read by one parser."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_jupyter.hostfile import parse_host_list
from mlx_jupyter.vocab import rank_env
from mlx_jupyter.launch.contract import plan_ranks
from mlx_jupyter.vocab.rank_env import RankEnv, RankEnvError, check_seconds, load_ring, read, variables
from mlx_jupyter.vocab.hosts import Address

seconds = st.one_of(st.just(-1.0), st.just(math.inf), st.floats(0, 1e6, allow_nan=False))
written = st.fixed_dictionaries({}, optional={
    "token": st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=20),
    "timeout": seconds,
    "connect_timeout": seconds,
    "dead_peer_timeout": st.floats(0.001, rank_env.MAX_DEAD_PEER),
    "transport": st.sampled_from(rank_env.TRANSPORTS),
    "shm": st.sampled_from(rank_env.SHM_MECHANISMS),
    "board": st.booleans(),
    "host_id": st.from_regex(r"[a-z0-9-]{1,12}", fullmatch=True),
    "backend": st.sampled_from(["ring", "jaccl", "mpi"]),
    "size": st.integers(1, 64),
    "early_world": st.booleans(),
    "cell_port": st.integers(1, 65535),
})


@given(written)
def test_what_launchers_write_a_rank_reads_back(settings):
    env = read(variables(**settings))
    for name, value in settings.items():
        assert getattr(env, name) == value, name


def test_nothing_set_is_a_plain_process():
    env = read({})
    assert env == RankEnv() and not env.ring_configured and not env.launched
    assert load_ring(env) is None


def test_the_launch_plan_is_read_as_planned(tmp_path):
    plans = plan_ranks("ring", parse_host_list("127.0.0.1", 3), token="secret", starting_port=20000)
    hostfile = tmp_path / "ring.json"
    hostfile.write_text(plans[0].files[rank_env.HOSTFILE])
    for plan in plans:
        env = read({**plan.env, rank_env.HOSTFILE: str(hostfile)})
        assert env.rank == plan.rank and env.token == "secret" and env.launched
        ring = load_ring(env)
        assert ring.rank == plan.rank
        assert ring.addresses == [[Address("127.0.0.1", 21000 + r)] for r in range(3)]  # + the core's offset


@pytest.mark.parametrize("var, value", [
    (rank_env.TIMEOUT, "soon"), (rank_env.TIMEOUT, "nan"), (rank_env.TIMEOUT, "-3"),
    (rank_env.CONNECT_TIMEOUT, "x"), (rank_env.DEAD_PEER_TIMEOUT, "0"), (rank_env.DEAD_PEER_TIMEOUT, "1e6"),
    (rank_env.TRANSPORT, "udp"), (rank_env.SHM, "memfd?"), (rank_env.BOARD, "off"), (rank_env.EARLY_WORLD, "no"),
    (rank_env.SIZE, "0"), (rank_env.SIZE, "two"), (rank_env.CELL_PORT, "70000"), (rank_env.PORT_OFFSET, "x"),
    (rank_env.RANK, "x"), (rank_env.RANK, "-1"), ("OMPI_COMM_WORLD_RANK", "first"),
])
def test_a_bad_value_names_its_variable_and_the_fix(var, value):
    with pytest.raises(RankEnvError) as info:
        read({var: value})
    msg = str(info.value)   # the variable and its value, then the fix: what to set it to, or to unset it
    assert msg.startswith(f"{var}=") and value in msg and re.search(r"[;:] (set|unset) ", msg), msg


@given(st.dictionaries(st.sampled_from([rank_env.TIMEOUT, rank_env.SIZE, rank_env.BOARD, rank_env.CELL_PORT,
                                        rank_env.TRANSPORT, rank_env.RANK, rank_env.PORT_OFFSET]),
                       st.text(max_size=8)))
def test_any_text_is_read_back_or_refused_naming_its_variable(env):
    try:
        got = read(env)
    except RankEnvError as exc:
        assert any(str(exc).startswith(f"{var}=") for var in env), (env, str(exc))
        return
    # each value set is the one read (unset or blank: the default)
    text = {var: env.get(var, "").strip() for var in env}
    assert got.size == (int(text[rank_env.SIZE]) if text.get(rank_env.SIZE) else 1)
    assert got.cell_port == (int(text[rank_env.CELL_PORT]) or None if text.get(rank_env.CELL_PORT) else None)
    assert got.port_offset == (int(text[rank_env.PORT_OFFSET]) if text.get(rank_env.PORT_OFFSET) else None)
    assert got.timeout == (float(env[rank_env.TIMEOUT]) if env.get(rank_env.TIMEOUT) else -1)
    assert got.transport == (env.get(rank_env.TRANSPORT) or "auto") and got.board == (env.get(rank_env.BOARD) != "0")
    assert got.rank == (int(env[rank_env.RANK]) if rank_env.RANK in env else None)
    # and what was read, written again by a launcher (variables), reads back the same
    fields = ("timeout", "size", "board", "cell_port", "transport")
    back = read(variables(**{f: getattr(got, f) for f in fields}))
    assert [getattr(back, f) for f in fields] == [getattr(got, f) for f in fields]


def test_the_one_timeout_rule():
    assert check_seconds(-1, "t") == -1 and check_seconds(math.inf, "t") == math.inf and check_seconds(0, "t") == 0
    for bad in (math.nan, -0.5, -2, -math.inf):
        with pytest.raises(ValueError, match=r"t must be >= 0 seconds \(or -1 to wait\)"):
            check_seconds(bad, "t")


def test_process_rank_comes_from_whichever_launcher_set_one():
    assert read({"SLURM_PROCID": "3"}).process_rank == 3
    assert read({"PMI_RANK": "2", "SLURM_PROCID": "3"}).process_rank == 2
    assert read({rank_env.RANK: "1", "PMI_RANK": "2"}).process_rank == 1
    assert read({"PMI_RANK": "2"}).rank is None  # not a ring rank


def test_launch_environments_of_mlx_backends():
    assert read({rank_env.WORLD_SIZE: "2", rank_env.NCCL_HOST_IP: "10.0.0.1"}).launchers == ("nccl",)
    assert read({"OMPI_COMM_WORLD_SIZE": "2", rank_env.JACCL_COORDINATOR: "10.0.0.1:1"}).launchers == ("mpi", "jaccl")


def test_a_nccl_rank_above_zero_is_not_taken_for_a_broken_ring():
    """An nccl launch sets MLX_RANK without a ring hostfile: reading it must not fail (the old reader did)."""
    env = read({rank_env.RANK: "1", rank_env.WORLD_SIZE: "2", rank_env.NCCL_HOST_IP: "10.0.0.1"})
    assert env.rank == 1 and "nccl" in env.launchers
    with pytest.raises(RankEnvError, match="MLX_HOSTFILE is not set"):
        load_ring(env)  # only asked for when the ring is chosen


def test_variables_refuses_what_no_launcher_writes():
    with pytest.raises(TypeError, match="not written by launchers"):
        variables(rank=1)
    with pytest.raises(TypeError, match="not RankEnv fields"):
        variables(colour="red")


def test_the_hostfile_is_read_through_the_given_reader():
    files = {"/h.json": json.dumps([["10.0.0.1:5000"], ["mac-2.local:5001", "[::1]:5002"]])}
    ring = load_ring(read({rank_env.RANK: "1", rank_env.HOSTFILE: "/h.json"}), files.__getitem__)
    assert ring.addresses == [[("10.0.0.1", 6000)], [("mac-2.local", 6001), ("::1", 6002)]]
    assert ring.source == "MLX_HOSTFILE=/h.json"
    own = load_ring(read({rank_env.RANK: "0", rank_env.OWN_HOSTFILE: "/h.json", rank_env.PORT_OFFSET: "7"}),
                    files.__getitem__)
    assert own.addresses[0] == [("10.0.0.1", 5000)] and own.source.startswith(rank_env.OWN_HOSTFILE)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                    max_leaves=20))
def test_ring_hostfiles_of_any_shape_give_only_errors_naming_the_file(data):
    try:
        rows = rank_env.parse_ring_hostfile(json.dumps(data), "hf.json")
    except RankEnvError as exc:
        msg = str(exc)   # the file, and the rank whose entry is wrong when the list has entries
        assert msg.startswith("hf.json"), msg
        if isinstance(data, list) and data:
            assert re.match(r"hf\.json: (entry \d+ \(rank \d+\) |rank \d+: )", msg), msg
        return
    assert rows and all(row and all(1 <= port <= 65535 for _, port in row) for row in rows)
    assert rank_env.parse_ring_hostfile(json.dumps([[str(a) for a in row] for row in rows]), "hf.json") == rows
    assert len(rows) == len(data) and [[str(a) for a in row] for row in rows] == [
        [entry] if isinstance(entry, str) else entry for entry in data]


address = st.builds(lambda a, b, p: f"{a}.{b}.0.1:{p}", st.integers(0, 255), st.integers(0, 255), st.integers(1, 65535))


@given(st.lists(st.lists(address, min_size=1, max_size=3), min_size=1, max_size=8))
def test_ring_hostfile_round_trip(rows):
    parsed = rank_env.parse_ring_hostfile(json.dumps(rows), "hf.json")
    assert [[str(a) for a in row] for row in parsed] == rows


@given(st.text(max_size=200))
def test_ring_hostfile_garbage_gives_only_errors_naming_the_file(text):
    try:
        rows = rank_env.parse_ring_hostfile(text, "hf.json")
    except RankEnvError as exc:
        assert str(exc).startswith("hf.json"), str(exc)
    else:   # accepted: JSON of one list of "ip:port" per rank, which reads back the same
        assert rank_env.parse_ring_hostfile(json.dumps([[str(a) for a in row] for row in rows]), "hf.json") == rows
