"""The one host-locality rule and the one ``ip:port`` format (issue 13), checked on any input."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_jupyter.hostfile import Host, parse_ring_hostfile
from mlx_jupyter.net.hosts import bare_host, format_addr, is_local, runs_here, split_addr

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


def test_ring_hostfile_parser_names_the_rank():
    assert parse_ring_hostfile([["127.0.0.1:5000"], ["[::1]:5001", "10.0.0.2:5002"]]) == [
        [("127.0.0.1", 5000)], [("::1", 5001), ("10.0.0.2", 5002)]]
    with pytest.raises(ValueError, match="rank 1: 'x' is not ip:port"):
        parse_ring_hostfile([["127.0.0.1:5000"], ["x"]])
    with pytest.raises(ValueError, match="JSON list"):
        parse_ring_hostfile({"hosts": []})
    assert parse_ring_hostfile(["mac-1:5000", ["mac-2.local:5001"]]) == [[("mac-1", 5000)], [("mac-2.local", 5001)]]
    with pytest.raises(ValueError, match="invalid host"):
        parse_ring_hostfile([["bad host:5000"]])


@given(st.recursive(st.none() | st.integers() | st.text(max_size=12), lambda c: st.lists(c, max_size=3), max_leaves=8))
def test_ring_hostfile_parser_raises_only_valueerror(data):
    try:
        parse_ring_hostfile(data)
    except ValueError:
        pass
