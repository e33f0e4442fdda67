"""The one host-locality rule and the one ``ip:port`` parser (issues 13, 24), checked on any input."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_jupyter.hostfile import Host
from mlx_jupyter.vocab.rank_env import RankEnvError, parse_ring_hostfile
from mlx_jupyter.vocab.hosts import Address, all_local, bare_host, format_addr, is_local, runs_here, split_addr

users = st.one_of(st.just(""), st.from_regex(r"[a-z_][a-z0-9_]{0,8}@", fullmatch=True))
loopback_v4 = st.integers(0x7F000000, 0x7FFFFFFF).map(lambda n: str(ipaddress.IPv4Address(n)))


@pytest.mark.parametrize("name, local, here", [
    ("127.0.0.1", True, True), ("localhost", True, True), ("LocalHost", True, True), ("::1", True, True),
    ("[::1]", True, True), ("127.3.2.1", True, True), ("alice@localhost", True, False),
    ("alice@127.0.0.1", True, False), ("10.0.0.1", False, False), ("mac-1", False, False),
    ("localhost.example.com", False, False), ("128.0.0.1", False, False), ("::2", False, False),
])
def test_recorded_cases(name, local, here):
    assert is_local(name) is local and runs_here(name) is here and Host(name).is_local is here


@given(users, loopback_v4)
def test_every_loopback_v4_is_local_with_or_without_a_user(user, ip):
    assert is_local(user + ip) and runs_here(user + ip) is (user == "")


@given(users, st.ip_addresses())
def test_locality_is_loopback_of_the_address(user, ip):
    text = f"{user}[{ip}]" if ip.version == 6 else f"{user}{ip}"
    assert is_local(text) is ip.is_loopback
    assert bare_host(text) == str(ip).lower()


@given(st.text(max_size=40))
def test_never_raises_on_any_text(text):
    assert isinstance(is_local(text), bool) and isinstance(runs_here(text), bool)


@given(st.ip_addresses(), st.integers(1, 65535))
def test_format_then_split_is_identity(ip, port):
    text = format_addr(str(ip), port)
    assert split_addr(text) == (str(ip), port)
    assert (text.startswith("[")) is (ip.version == 6)


@given(st.text(max_size=30))
def test_split_addr_raises_only_valueerror(text):
    try:
        host, port = split_addr(text)
    except ValueError:
        return
    assert 0 < port < 65536 and host


def test_unbracketed_ipv6_is_refused_naming_the_fix():
    with pytest.raises(ValueError, match=r"needs brackets, as in \[::1\]:32323"):
        split_addr("::1:32323")


# The two copies this parser replaced disagreed (issue 24): core/rank_env.py took "::1:32323"
# (as [::1]:32323) and refused "host_name:80"; hostfile.py's split_addr did the opposite. MLX's
# ring reads "ip:port" with getaddrinfo, which resolves names with '_' (/etc/hosts), and an
# unbracketed IPv6 address with a port is ambiguous ("::1:32323" is also the address ::1:32323):
# split_addr was right on both, rank_env wrong on both.
@pytest.mark.parametrize("text, parsed", [
    ("::1:32323", None), ("fe80::1%en0:5000", None), ("host_name:80", ("host_name", 80)),
    ("[::1]:32323", ("::1", 32323)), ("[fe80::1%en0]:5000", ("fe80::1%en0", 5000)), ("mac-1.local:5", ("mac-1.local", 5)),
    ("10.0.0.1:65535", ("10.0.0.1", 65535)), ("10.0.0.1:0", None), ("10.0.0.1:65536", None), ("10.0.0.1:²", None),
    ("999.0.0.1:80", None), ("[mac-1]:80", None), ("[10.0.0.1]:80", None), ("-opt:80", None), ("a..b:80", None),
    ("host.:80", None), ("bad host:80", None), ("10.0.0.1", None), (":80", None), ("host:", None),
])
def test_the_cases_the_old_copies_disagreed_on_and_their_neighbours(text, parsed):
    if parsed is None:
        with pytest.raises(ValueError, match=repr(text).replace("[", r"\[").replace("]", r"\]")):
            split_addr(text)
    else:
        assert split_addr(text) == parsed and str(split_addr(text)) == format_addr(*parsed)


labels = st.from_regex(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,10}[A-Za-z0-9_])?", fullmatch=True)
host_names = st.lists(labels, min_size=1, max_size=4).filter(lambda ls: not ls[-1].isdigit()).map(".".join)


@given(host_names, st.integers(1, 65535))
def test_every_host_name_with_a_port_parses(name, port):
    assert split_addr(f"{name}:{port}") == Address(name, port)


@given(st.ip_addresses(v=6), st.integers(1, 65535))
def test_an_ipv6_address_parses_only_in_brackets(ip, port):
    assert split_addr(f"[{ip}]:{port}") == (str(ip), port)
    with pytest.raises(ValueError, match="brackets"):
        split_addr(f"{ip}:{port}")


def test_ring_hostfile_parser_names_the_rank():
    text = '[["127.0.0.1:5000"], ["[::1]:5001", "10.0.0.2:5002"]]'
    assert parse_ring_hostfile(text, "hf") == [[("127.0.0.1", 5000)], [("::1", 5001), ("10.0.0.2", 5002)]]
    with pytest.raises(RankEnvError, match="hf: rank 1: 'x' is not ip:port"):
        parse_ring_hostfile('[["127.0.0.1:5000"], ["x"]]', "hf")
    with pytest.raises(RankEnvError, match="JSON list"):
        parse_ring_hostfile('{"hosts": []}', "hf")
    assert parse_ring_hostfile('["mac-1:5000", ["mac_2.local:5001"]]', "hf") == [[("mac-1", 5000)],
                                                                                 [("mac_2.local", 5001)]]
    with pytest.raises(RankEnvError, match="invalid host"):
        parse_ring_hostfile('[["bad host:5000"]]', "hf")


def test_all_local_is_every_host_local():
    assert all_local(["localhost", "127.0.0.2", "[::1]"]) and all_local([])
    assert not all_local(["localhost", "10.0.0.1"]) and not all_local(["mac-1"])


def test_the_machine_part_keeps_every_letter_and_drops_a_zone_for_loopback():
    assert bare_host("Xserve") == "xserve" and bare_host("ann@XX") == "xx" and bare_host(" [::1] ") == "::1"
    assert is_local("127.0.0.1%lo") and is_local("[::1%lo]") and not is_local("10.0.0.1%lo")


@pytest.mark.parametrize("text, error", [
    (80, r"80 is not an \"ip:port\" string"),
    (":80", r"':80' is not ip:port \(as in 10.0.0.1:32323"),
    ("mac-1:", r"'mac-1:' has no valid port \(a number in 1..65535"),
    ("mac-1:000080", "'mac-1:000080' has no valid port"),
    ("mac-1:0", "has no valid port"), ("mac-1:65536", "has no valid port"),
    ("[::1:80", r"'\[::1:80': only an IPv6 address goes in brackets, as in \[::1\]:32323"),
    ("::1]:80", r"'::1\]:80': only an IPv6 address goes in brackets"),
    ("[10.0.0.1]:80", "only an IPv6 address goes in brackets"),
    ("::1:80", r"'::1:80': an IPv6 address needs brackets, as in \[::1\]:32323"),
    ("a..b:80", r"'a..b:80': invalid host 'a..b' \(a host name is letters, digits, '-' and '_' between dots\)"),
    ("mac.1:80", r"'mac.1:80': invalid host 'mac.1' \(not an IPv4 address, and a host name does not end in a number\)"),
])
def test_each_bad_address_is_refused_with_its_own_reason(text, error):
    with pytest.raises(ValueError, match=error):
        split_addr(text)


def test_ports_and_host_names_at_their_limits():
    assert split_addr("mac-1:1") == ("mac-1", 1) and split_addr("mac-1:65535") == ("mac-1", 65535)
    assert split_addr("mac-1:00080") == ("mac-1", 80)   # five digits at most, leading zeros allowed
    name = ".".join(["a" * 63] * 4)[:253]   # the longest name DNS allows
    assert split_addr(f"{name}:80") == (name, 80)
    with pytest.raises(ValueError, match="invalid host"):
        split_addr(f"{name}a:80")
