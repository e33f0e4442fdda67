"""Hostfile parsing, writing and ring port plans (pure)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_jupyter.hostfile import (
    Host, Hostfile, HostfileError, check_ssh_name, dumps_hostfile, loads_hostfile, parse_env, parse_host_list,
    read_hostfile, repeat_hosts, resolve_hosts, ring_ports, write_hostfile,
)


def test_host_list_ips_and_repeats():
    hosts = parse_host_list("10.0.0.1,mac-2", repeat=2)
    assert [h.ssh for h in hosts] == ["10.0.0.1", "10.0.0.1", "mac-2", "mac-2"]
    assert [h.ips for h in hosts] == [["10.0.0.1"], ["10.0.0.1"], [], []]
    assert hosts[0].is_local is False and parse_host_list("127.0.0.1")[0].is_local


@pytest.mark.parametrize("text", ["a,,b", "", ",", "a, "])
def test_empty_host_entry_is_an_error(text):
    with pytest.raises(HostfileError, match="empty"):
        parse_host_list(text)


def test_repeat_must_be_positive():
    with pytest.raises(HostfileError, match="repeat-hosts"):
        parse_host_list("a", repeat=0)


@pytest.mark.parametrize("name", ["a;b", "$(reboot)", "`id`", "a b", "-oProxyCommand=x", "a\nb", "a'b", 'a"b', "a|b"])
def test_hostile_host_names_are_refused(name):
    with pytest.raises(HostfileError, match="not a valid host name"):
        parse_host_list(name)
    with pytest.raises(HostfileError, match="host 0"):
        loads_hostfile(json.dumps([{"ssh": name}]))


@pytest.mark.parametrize("name", ["mac-1", "mac-1.local", "root@10.0.0.1", "fe80::1", "[::1]", "host_2", "a.b-c"])
def test_reasonable_host_names_pass(name):
    assert check_ssh_name(name) == name


def test_plain_list_and_object_form():
    plain = [{"ssh": "h1", "ips": ["10.0.0.1"], "rdma": [None, "rdma_en5"]}, {"ssh": "h2", "ips": ["10.0.0.2"]}]
    hf = loads_hostfile(json.dumps(plain))
    assert hf.backend is None and hf.envs == []
    assert hf.hosts[0].rdma == [None, "rdma_en5"] and hf.hosts[1].rdma == []
    obj = {"backend": "jaccl", "envs": ["A=1"], "hosts": plain}
    hf2 = loads_hostfile(json.dumps(obj))
    assert hf2.backend == "jaccl" and hf2.envs == ["A=1"] and hf2.hosts == hf.hosts


def test_rdma_may_list_several_devices():
    hf = loads_hostfile(json.dumps([{"ssh": "a", "rdma": [None, ["rdma_en3", "rdma_en4"]]}, {"ssh": "b"}]))
    assert hf.hosts[0].rdma[1] == ["rdma_en3", "rdma_en4"]


@pytest.mark.parametrize("text, match", [
    ("{", "not valid JSON"),
    ("[]", "empty"),
    ("42", "expected a JSON list"),
    ('{"hosts": [{"ssh": "a"}], "host": 1}', "the top level: unknown field 'host': did you mean 'hosts'"),
    ('{"backend": "tcp", "hosts": [{"ssh": "a"}]}', "backend 'tcp'"),
    ('[{"ips": ["1.2.3.4"]}]', "missing the 'ssh' field"),
    ('[{"ssh": "a", "ips": ["nope"]}]', r"ips\[0\]"),
    ('[{"ssh": "a", "ips": "1.2.3.4"}]', "'ips' must be a list"),
    ('[{"ssh": "a", "rdma": [1]}]', r"rdma\[0\]"),
    ('[{"ssh": "a", "ipz": ["1.2.3.4"]}]', "host 0 .*: unknown field 'ipz': did you mean 'ips'"),
    ('[{"ssh": "a", "RDMA": []}]', "did you mean 'rdma'"),
    ('{"hosts": [{"ssh": "a"}], "envv": []}', "did you mean 'envs'"),
    ('[' * 100000, "nested deeper than"),
    ('[' * 40 + ']' * 40, "nested deeper than"),
    ('1' * 5000, "not valid JSON"),
    ('{"envs": "A=1", "hosts": [{"ssh": "a"}]}', "'envs'"),
])
def test_malformed_hostfiles_name_the_field(text, match):
    with pytest.raises(HostfileError, match=match):
        loads_hostfile(text, "hostfile 'x.json'")


def test_read_missing_file(tmp_path):
    with pytest.raises(HostfileError, match="nope.json': cannot open it"):
        read_hostfile(tmp_path / "nope.json")


def test_write_read_roundtrip_both_forms(tmp_path):
    hf = Hostfile([Host("h1", ["10.0.0.1"], [None, "rdma_en2"]), Host("h2", ["10.0.0.2"], ["rdma_en2", None])],
                  "jaccl", ["K=V"])
    for form in ("list", "object", "auto"):
        path = tmp_path / f"{form}.json"
        write_hostfile(path, hf, form)
        back = read_hostfile(path)
        assert back.hosts == hf.hosts
        if form != "list":
            assert back.backend == "jaccl" and back.envs == ["K=V"]
    assert isinstance(json.loads(dumps_hostfile(hf.hosts)), list)


def test_resolve_hosts_accepts_all_forms(tmp_path):
    path = tmp_path / "hf.json"
    write_hostfile(path, [Host("h1", ["10.0.0.1"])])
    assert [h.ssh for h in resolve_hosts(str(path), 2)] == ["h1", "h1"]
    assert [h.ssh for h in resolve_hosts("a,b")] == ["a", "b"]
    assert [h.ssh for h in resolve_hosts([Host("x")], 3)] == ["x"] * 3
    assert resolve_hosts(None)[0].ssh == "127.0.0.1"
    with pytest.raises(HostfileError):
        resolve_hosts([Host("a;b")])


def test_ring_plan_matches_the_reference_numbering():
    hosts = [Host("a", ["10.0.0.1", "10.0.1.1"]), Host("b", ["10.0.0.2", "10.0.1.2"])]
    assert ring_ports(hosts, 5000, 2) == [
        ["10.0.0.1:5000", "10.0.0.1:5001", "10.0.1.1:5002", "10.0.1.1:5003"],
        ["10.0.0.2:5004", "10.0.0.2:5005", "10.0.1.2:5006", "10.0.1.2:5007"],
    ]


def test_ring_plan_needs_ips_and_room_for_the_core_offset():
    with pytest.raises(HostfileError, match="no IP"):
        ring_ports([Host("mac-1")])
    with pytest.raises(HostfileError, match="65535"):
        ring_ports([Host("a", ["10.0.0.1"])] * 4, 64800)


def test_parse_env_warns_and_skips_bad_keys():
    env, warnings = parse_env(["A=1", "B_2=x=y", "BAD-KEY=1", "noequals", "1X=2", "E="])
    assert env == {"A": "1", "B_2": "x=y", "E": ""}
    assert len(warnings) == 3 and all("skipped" in w for w in warnings)


# ------------------------------------------------------------- properties --

_names = st.from_regex(r"[a-z][a-z0-9-]{0,12}(\.[a-z0-9]{1,5}){0,2}", fullmatch=True)
_ipv4 = st.tuples(*[st.integers(0, 255)] * 4).map(lambda t: ".".join(map(str, t)))
_dev = st.from_regex(r"rdma_en[0-9]{1,2}", fullmatch=True)


@st.composite
def hostfiles(draw):
    n = draw(st.integers(1, 6))
    hosts = []
    for i in range(n):
        rdma = draw(st.one_of(st.just([]), st.lists(st.one_of(st.none(), _dev, st.lists(_dev, min_size=1, max_size=2)),
                                                    min_size=n, max_size=n)))
        hosts.append(Host(draw(st.one_of(_names, _ipv4)), draw(st.lists(_ipv4, max_size=3)), rdma))
    return Hostfile(hosts, draw(st.sampled_from([None, "ring", "jaccl", "mpi"])),
                    draw(st.lists(st.from_regex(r"[A-Z_]{1,6}=[ -~]{0,8}", fullmatch=True), max_size=3)))


@settings(max_examples=150, deadline=None)
@given(hostfiles(), st.sampled_from(["object", "auto"]))
def test_dump_then_load_is_identity(hf, form):
    back = loads_hostfile(dumps_hostfile(hf, form))
    assert back.hosts == hf.hosts
    assert back.backend == hf.backend
    assert back.envs == hf.envs or (form == "auto" and not hf.backend and not hf.envs)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_garbage_is_refused_saying_where_or_read_back_the_same(text):
    try:
        hf = loads_hostfile(text)
    except HostfileError as exc:
        try:
            json.loads(text)
        except json.JSONDecodeError as bad:   # not JSON: the line and column JSON's parser stopped at
            assert str(exc) == f"hostfile: not valid JSON (line {bad.lineno}, column {bad.colno}: {bad.msg})"
        else:
            assert str(exc).startswith("hostfile: "), str(exc)
        return
    _assert_reads_back(hf)


def _assert_reads_back(hf) -> None:
    """What the parser accepted, written out and read again, is the same hostfile."""
    back = loads_hostfile(dumps_hostfile(hf, "object"))
    assert (back.hosts, back.backend, back.envs) == (hf.hosts, hf.backend, hf.envs)


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(["ssh", "ips", "rdma", "hosts", "backend", "envs", "x"]), c, max_size=4),
                    max_leaves=12))
def test_any_json_is_read_back_the_same_or_refused_naming_the_host(data):
    try:
        hf = loads_hostfile(json.dumps(data))
    except HostfileError as exc:
        msg = str(exc)
        assert msg.startswith("hostfile: "), msg
        named = re.match(r"hostfile: host (\d+) \(rank \1\)", msg)
        if named:   # the host it names exists, and is refused on its own too (unless the fault is between hosts)
            hosts = data if isinstance(data, list) else data["hosts"]
            i = int(named.group(1))
            assert i < len(hosts), msg
            if "rdma" not in msg:
                with pytest.raises(HostfileError):
                    loads_hostfile(json.dumps([hosts[i]]))
        return
    _assert_reads_back(hf)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_ipv4, min_size=1, max_size=3), min_size=1, max_size=6), st.integers(1, 3),
       st.integers(1024, 20000))
def test_ring_ports_are_distinct_and_consecutive(ips, conns, start):
    plan = ring_ports([Host(f"h{i}", x) for i, x in enumerate(ips)], start, conns)
    ports = [int(a.rsplit(":", 1)[1]) for row in plan for a in row]
    assert ports == list(range(start, start + len(ports)))
    assert [len(r) for r in plan] == [len(x) * conns for x in ips]


@settings(max_examples=100, deadline=None)
@given(st.lists(_names, min_size=1, max_size=5), st.integers(1, 4))
def test_repeat_keeps_host_order(names, n):
    hosts = repeat_hosts([Host(x) for x in names], n)
    assert [h.ssh for h in hosts] == [x for x in names for _ in range(n)]


def test_a_file_named_like_a_host_does_not_make_the_host_a_hostfile(tmp_path, monkeypatch):
    """hosts="localhost" next to a file called localhost is still the host (issue 21, item 10)."""
    from pathlib import Path

    from mlx_jupyter.hostfile import hostfile_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "localhost").write_text("not a hostfile")
    (tmp_path / "h.json").write_text(json.dumps([{"ssh": "10.0.0.7"}]))
    assert [h.ssh for h in resolve_hosts("localhost")] == ["localhost"]
    assert hostfile_path("localhost") is None and hostfile_path("mac-1,mac-2") is None
    assert [h.ssh for h in resolve_hosts("h.json")] == ["10.0.0.7"]   # a .json name, a path or a Path is a file
    assert hostfile_path("./localhost") == "./localhost" and hostfile_path(Path("localhost")) == "localhost"
