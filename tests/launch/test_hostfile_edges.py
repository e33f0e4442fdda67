"""The hostfile reader and host lists at their edges: each refusal's words, bounds, and what is kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlx_jupyter.hostfile import (MAX_DEPTH, Host, Hostfile, HostfileError, check_env_key, check_ssh_name,
                                  default_ranks_per_host, dumps_hostfile, hostfile_path, loads_hostfile,
                                  merge_settings, parse_env, parse_host_list, repeat_hosts, resolve_hosts, ring_ports)


def _refused(text: str) -> str:
    with pytest.raises(HostfileError) as info:
        loads_hostfile(text)
    return str(info.value)


def test_ring_ports_reach_65535_with_the_core_offset_and_no_further():
    last = 65535 - 1000
    assert ring_ports([Host("a", ["10.0.0.1"]), Host("b", ["10.0.0.2"])], last - 1) == [[f"10.0.0.1:{last - 1}"], [f"10.0.0.2:{last}"]]
    assert ring_ports([Host("a", ["10.0.0.1"])], 1) == [["10.0.0.1:1"]]
    with pytest.raises(HostfileError) as info:
        ring_ports([Host("a", ["10.0.0.1"]), Host("b", ["10.0.0.2"])], last)
    assert str(info.value) == (f"--starting-port {last}: the ring needs ports {last}..{last + 1} (and +1000 for our "
                               "core), which leaves 1..65535")
    with pytest.raises(HostfileError, match=r"^--starting-port 0: the ring needs ports 0..0 "):
        ring_ports([Host("a", ["10.0.0.1"])], 0)
    with pytest.raises(HostfileError, match=r"^--connections-per-ip must be > 0, got 0$"):
        ring_ports([Host("a", ["10.0.0.1"])], 5000, 0)
    with pytest.raises(HostfileError, match=r"^rank 1 on host 'b' has no IP: the ring backend needs an IP per rank; "
                                            r"use a hostfile with \"ips\" or list hosts by IP$"):
        ring_ports([Host("a", ["10.0.0.1"]), Host("b")], 5000)
    assert ring_ports([Host("a", ["10.0.0.1", "::1"])], 5000, 2) == [
        ["10.0.0.1:5000", "10.0.0.1:5001", "[::1]:5002", "[::1]:5003"]]


def test_host_lists_and_repeats():
    assert parse_host_list(" 10.0.0.1 ,mac-1", 2) == [Host("10.0.0.1", ["10.0.0.1"])] * 2 + [Host("mac-1")] * 2
    for bad, why in [("a,,b", "--hosts 'a,,b': entry 2 is empty"), ("a, ", "--hosts 'a, ': entry 2 is empty")]:
        with pytest.raises(HostfileError) as info:
            parse_host_list(bad)
        assert str(info.value) == why
    with pytest.raises(HostfileError, match=r"^--hosts entry 2: host name 'b c' is not a valid"):
        parse_host_list("a,b c")
    for fn in (lambda: parse_host_list("a", 0), lambda: repeat_hosts([Host("a")], 0)):
        with pytest.raises(HostfileError, match=r"^-n/--repeat-hosts must be > 0, got 0$"):
            fn()
    hosts = repeat_hosts([Host("a", ["10.0.0.1"], [None]), Host("b")], 2)
    assert [h.ssh for h in hosts] == ["a", "a", "b", "b"] and hosts[0] == hosts[1] and hosts[0].ips is not hosts[1].ips
    assert resolve_hosts(None, 2) == [Host("127.0.0.1", ["127.0.0.1"])] * 2
    assert resolve_hosts([Host("a")], 1) == [Host("a")]
    for bad in ([], [Host("a"), "b"]):
        with pytest.raises(HostfileError, match=r"^hosts must be a non-empty list of mlx_jupyter.hostfile.Host$"):
            resolve_hosts(bad)
    with pytest.raises(HostfileError, match=r"^host 1: host name '-oProxy' is not a valid"):
        resolve_hosts([Host("a"), Host("-oProxy")])
    assert default_ranks_per_host(True) == 1 and default_ranks_per_host(False) == 2


def test_a_hostfile_is_a_path_or_a_name_ending_in_json_in_any_case(tmp_path):
    assert hostfile_path("h.json") == "h.json" and hostfile_path("H.JSON") == "H.JSON" and hostfile_path("a/b") == "a/b"
    assert hostfile_path(Path("h")) == "h" and hostfile_path("mac-1") is None and hostfile_path(["a"]) is None
    f = tmp_path / "Cluster.JSON"
    f.write_text(json.dumps([{"ssh": "10.0.0.7"}]))
    assert resolve_hosts(str(f), 2) == [Host("10.0.0.7")] * 2


def test_ssh_names_and_env_keys():
    for ok in ("a", "ann@mac-1.local", "10.0.0.1", "[::1]", "fe80::1%en0", "_x", "a+b@h"):
        assert check_ssh_name(ok) == ok
    with pytest.raises(HostfileError, match=r"^where: the host name is empty; give a DNS name or an IP$"):
        check_ssh_name("", "where")
    with pytest.raises(HostfileError, match=r"^host: the host name is empty"):
        check_ssh_name(None)
    for bad in ("-x", "a b", "a;b", "@h", "a@-h", "h\n"):
        with pytest.raises(HostfileError, match=r"is not a valid host name or address \(letters, digits, '.', '-', '_', "
                                                r"optionally 'user@'; it may not start with '-'\)$"):
            check_ssh_name(bad)
    assert check_env_key("A_1") and check_env_key("_") and not check_env_key("1A") and not check_env_key("A-B")
    assert not check_env_key("") and not check_env_key("A\n")   # a trailing newline too (a regex's `$` allows it)


def test_parse_env_keeps_the_good_items_and_says_why_it_skips_the_others():
    env, warnings = parse_env(["A=1", "B==2", "1X=3", "C", "D", "E=a\0b", "F="], "hf envs", {"C": "from here"})
    assert env == {"A": "1", "B": "=2", "C": "from here", "F": ""}
    assert warnings == ["hf envs '1X=3': expected KEY=VALUE with KEY made of [A-Za-z0-9_]; skipped",
                        "hf envs D: is not set here (a bare KEY passes this environment's value on); skipped",
                        "hf envs E: the value contains a NUL byte; skipped"]
    assert parse_env(["C"]) == ({}, ["--env C: needs =VALUE here (a bare KEY passes this environment's value on); skipped"])


def test_each_refusal_of_a_hostfile_names_the_host_and_field():
    assert _refused('{"hosts": [{"ssh": "a"}], "backend": "gloo"}') == \
        "hostfile: backend 'gloo' is not one of ring, jaccl, jaccl-ring, nccl, mpi"
    assert _refused('{"backend": "ring"}') == "hostfile: the object form needs a 'hosts' list"
    assert _refused('{"hosts": [{"ssh": "a"}], "envs": "A=1"}') == "hostfile: 'envs' must be a list of \"KEY=VALUE\" strings"
    assert _refused('{"hosts": [{"ssh": "a"}], "envs": [1]}') == "hostfile: 'envs' must be a list of \"KEY=VALUE\" strings"
    assert _refused('{"hosts": [{"ssh": "a"}], "backnd": "ring"}') == (
        "hostfile: the top level: unknown field 'backnd': did you mean 'backend'? (the fields are backend, envs, "
        "hosts; others are ignored)")
    assert _refused('[{"ssh": "a", "ipz": []}]').startswith("hostfile: host 0 (rank 0): unknown field 'ipz': did you mean 'ips'?")
    assert _refused('[{"ssh": "a"}, {"ssh": "b", "ips": "10.0.0.1"}]') == \
        "hostfile: host 1 (rank 1): 'ips' must be a list of IP addresses, got '10.0.0.1'"
    assert _refused('[{"ssh": "a", "ips": ["10.0.0.1", 7]}]') == "hostfile: host 0 (rank 0): ips[1] = 7 is not an IP address"
    assert _refused('[{"ssh": "a", "rdma": [null, ""]}]') == \
        "hostfile: host 0 (rank 0): rdma[1] must be null, a device name or a list of names, got ''"
    assert _refused('[{"ssh": "a", "rdma": [[]]}]').endswith("rdma[0] must be null, a device name or a list of names, got []")
    assert _refused('[{"ssh": "a", "rdma": [["x", ""]]}]').endswith("got ['x', '']")
    assert _refused('[{"ssh": "a", "rdma": {}}]') == "hostfile: host 0 (rank 0): 'rdma' must be a list (null on the diagonal), got dict"
    assert _refused('[7]') == 'hostfile: host 0 (rank 0): expected an object like {"ssh": "host1", "ips": [...]}, got 7'
    assert _refused("[]") == "hostfile: the host list is empty"
    assert _refused("1" * 5000) == "hostfile: not valid JSON (a number too long to read)"
    with pytest.raises(HostfileError) as info:
        loads_hostfile('[{"ssh": "a"}, {"x": 1}]')
    assert info.value.entry == 1


def test_nesting_is_allowed_up_to_max_depth():
    def nested(levels: int) -> str:   # the host list, then a host, then an unknown field nesting lists
        return json.dumps([{"ssh": "a", "note": json.loads("[" * (levels - 2) + "]" * (levels - 2))}])
    assert loads_hostfile(nested(MAX_DEPTH)).hosts == [Host("a")]
    assert _refused(nested(MAX_DEPTH + 1)) == f"hostfile: not a hostfile (nested deeper than {MAX_DEPTH} levels)"
    assert _refused("[" * 100000 + "]" * 100000) == f"hostfile: not a hostfile (nested deeper than {MAX_DEPTH} levels)"


def test_ignored_fields_are_named_once_with_their_hosts():
    hf = loads_hostfile(json.dumps({"hosts": [{"ssh": f"h{i}", "zone": 1} for i in range(6)], "comment": "x"}))
    assert hf.warnings == ["hostfile: ignored unknown field(s) 'comment' (top level), 'zone' (hosts 0, 1, 2, 3, ...), "
                           "as MLX ignores them (a hostfile's fields: backend, envs, hosts; a host's: ssh, ips, rdma)"]
    one = loads_hostfile(json.dumps([{"ssh": "a", "zone": 1}]))
    assert one.warnings[0].startswith("hostfile: ignored unknown field(s) 'zone' (host 0), as MLX")
    many = loads_hostfile(json.dumps({"hosts": [{"ssh": "a"}], **{f"note{i}": i for i in range(10)}}))
    assert "'note7' (top level) and 2 more, as MLX" in many.warnings[0] and "note8" not in many.warnings[0]
    assert loads_hostfile('[{"ssh": "a"}]').warnings == []
    assert loads_hostfile('{"hosts": ["a"], "backend": ""}').backend is None


def test_dumps_forms_and_merge_settings():
    hosts = [Host("a", ["10.0.0.1"], [None])]
    assert dumps_hostfile(hosts) == json.dumps([{"ssh": "a", "ips": ["10.0.0.1"], "rdma": [None]}], indent=2) + "\n"
    assert json.loads(dumps_hostfile(Hostfile(hosts, "ring"))) == {"backend": "ring", "envs": [], "hosts": [hosts[0].to_json()]}
    assert json.loads(dumps_hostfile(Hostfile(hosts, None, ["A=1"])))["backend"] == ""
    assert json.loads(dumps_hostfile(hosts, "object"))["backend"] == ""
    with pytest.raises(ValueError, match=r"^form must be 'list', 'object' or 'auto', not 'yaml'$"):
        dumps_hostfile(hosts, "yaml")
    hf = Hostfile(hosts, "mpi", ["A=1", "B=2", "bad key=1"], ["w0"])
    got = merge_settings(hf, "h.json", backend="ring", env={"A": "9", "B": "2", "C": "3"})
    assert (got.backend, got.env) == ("ring", {"A": "9", "B": "2", "C": "3"})
    assert got.notices == ["w0", "h.json envs 'bad key=1': expected KEY=VALUE with KEY made of [A-Za-z0-9_]; skipped",
                           "h.json says backend 'mpi'; using 'ring' as given explicitly",
                           "h.json sets A=1; using A=9 as given explicitly"]
    assert merge_settings(hf, "h.json").backend == "mpi" and merge_settings(hf, "h.json", "mpi").notices[-1] == \
        "h.json envs 'bad key=1': expected KEY=VALUE with KEY made of [A-Za-z0-9_]; skipped"
    assert merge_settings(None, "x", "nccl", {"A": "1"}) .env == {"A": "1"}


# ------------------------------------------ what a launch may be given --

def test_a_launch_of_at_most_1024_ranks_in_all():
    assert len(parse_host_list(",".join(["h"] * 1024))) == 1024
    assert len(repeat_hosts([Host("a", [])] * 512, 2)) == 1024
    assert len(parse_host_list("a,b", 512)) == 1024
    with pytest.raises(HostfileError) as info:
        parse_host_list(",".join(["h"] * 1100))
    assert str(info.value) == ("1100 hosts with -n 1 make 1100 ranks: at most 1024 ranks in all "
                               "(fewer hosts, or a smaller -n)")
    with pytest.raises(HostfileError, match=r"^2 hosts with -n 513 make 1026 ranks: at most 1024"):
        parse_host_list("a,b", 513)
    with pytest.raises(HostfileError, match=r"^1025 hosts with -n 1 make 1025 ranks: at most 1024"):
        repeat_hosts([Host("a", [])] * 1025, 1)
    with pytest.raises(HostfileError, match=r"^513 hosts with -n 2 make 1026 ranks"):
        repeat_hosts([Host("a", [])] * 513, 2)


def test_a_hostfile_of_1100_entries_is_refused_before_any_rank_starts(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps([{"ssh": f"h{i}"} for i in range(1100)]))
    with pytest.raises(HostfileError, match=r"^1100 hosts with -n 1 make 1100 ranks: at most 1024"):
        resolve_hosts(str(path))


@pytest.mark.parametrize("key", ["MLX_RANK", "MLX_HOSTFILE", "MLX_WORLD_SIZE", "NCCL_HOST_IP", "NCCL_PORT",
                                 "MLX_JACCL_COORDINATOR", "MLX_IBV_DEVICES", "MLX_JUPYTER_TOKEN", "MLX_JUPYTER_HOSTFILE"])
def test_a_variable_the_launcher_sets_is_refused_where_it_is_given(key):
    with pytest.raises(HostfileError) as info:
        merge_settings(None, "x", "ring", {"A": "1", key: "3"})
    assert str(info.value).startswith(f"--env {key}: the launcher sets it for each rank (")
    assert str(info.value).endswith("); drop it")
    with pytest.raises(HostfileError, match=rf"^env \(--env\) {key}: the launcher sets it"):
        merge_settings(None, "x", "ring", {key: "3"}, env_source="env (--env)")
    hf = Hostfile([Host("a", ["10.0.0.1"])], envs=["B=2", f"{key}=3"])
    with pytest.raises(HostfileError, match=rf"^hostfile h.json envs {key}: the launcher sets it for each rank"):
        merge_settings(hf, "hostfile h.json", "ring", {"A": "1"})


def test_variables_of_the_users_own_pass():
    hf = Hostfile([Host("a", ["10.0.0.1"])], envs=["MLX_METAL_FAST_SYNCH=1", "MLX_JUPYTER_TIMEOUT=5"])
    got = merge_settings(hf, "hostfile h.json", "ring", {"MLX_RANKS": "x", "RANK": "2", "MLX_JUPYTER_PORT_OFFSET": "7"})
    assert got.env == {"MLX_METAL_FAST_SYNCH": "1", "MLX_JUPYTER_TIMEOUT": "5", "MLX_RANKS": "x", "RANK": "2",
                       "MLX_JUPYTER_PORT_OFFSET": "7"}
