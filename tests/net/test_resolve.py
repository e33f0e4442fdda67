"""Host names to addresses as ssh would reach them (ssh config HostName, then the resolver), and which
ranks need one. No DNS: lookups are injected, or of `localhost` (answered from /etc/hosts)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_jupyter.hostfile import Host
from mlx_jupyter.launch.addresses import fill_addresses, needing_address
from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.net.resolve import Address, UnresolvedHost, resolve_host
from mlx_jupyter.net.ssh import SSHOptions


def options(tmp_path: Path, text: str) -> SSHOptions:
    cfg = tmp_path / "ssh_config"
    cfg.write_text(text)
    return SSHOptions(config=[str(cfg)])


def no_lookup(hostname: str):
    raise AssertionError(f"{hostname!r} must not be looked up")


def answers(table: dict[str, list[str]]):
    """A lookup that answers from ``table`` (a gaierror for other names) and records what was asked."""
    asked: list[str] = []

    async def lookup(hostname: str) -> list[str]:
        asked.append(hostname)
        if hostname not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return table[hostname]
    lookup.asked = asked  # type: ignore[attr-defined]
    return lookup


def resolve(name: str, opts: SSHOptions | None = None, lookup=no_lookup, timeout: float = 5.0) -> Address:
    return asyncio.run(resolve_host(name, opts, lookup, timeout))


def test_an_ip_is_itself_and_the_ssh_config_hostname_wins(tmp_path: Path) -> None:
    assert resolve("10.9.8.7") == Address("10.9.8.7", "10.9.8.7", "10.9.8.7")
    assert resolve("root@[fd00::5]").ip == "fd00::5"
    opts = options(tmp_path, "Host mac-a\n    HostName 10.77.0.5\nHost mac-b\n    HostName mac-b.lan\n")
    a = resolve("mac-a", opts)
    assert a.ip == "10.77.0.5" and a.describe() == "mac-a (HostName 10.77.0.5) -> 10.77.0.5"
    lookup = answers({"mac-b.lan": ["192.168.3.4"]})
    assert resolve("alice@mac-b", opts, lookup).ip == "192.168.3.4" and lookup.asked == ["mac-b.lan"]


def test_localhost_runs_here_whatever_the_ssh_config_says(tmp_path: Path) -> None:
    opts = options(tmp_path, "Host *\n    HostName 10.66.0.1\n")
    lookup = answers({"localhost": ["127.0.0.1", "::1"]})
    assert resolve("localhost", opts, lookup) == Address("localhost", "localhost", "127.0.0.1")
    assert asyncio.run(resolve_host("localhost")).ip in ("127.0.0.1", "::1")   # the real resolver: /etc/hosts


def test_names_that_do_not_resolve_say_why(tmp_path: Path) -> None:
    opts = options(tmp_path, "Host mac-b\n    HostName mac-b.lan\n")
    with pytest.raises(UnresolvedHost, match=r"^its HostName 'mac-b.lan' \(from the ssh config\) does not resolve "
                                             r"\(Name or service not known\)$"):
        resolve("mac-b", opts, answers({}))
    with pytest.raises(UnresolvedHost, match=r"^it does not resolve"):
        resolve("mac-c", options(tmp_path, ""), answers({}))

    async def silent(hostname: str) -> list[str]:
        await asyncio.sleep(30)
        return []
    with pytest.raises(UnresolvedHost, match="no answer from the resolver within 0.05 s"):
        resolve("mac-c", options(tmp_path, ""), silent, timeout=0.05)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=4))
def test_whatever_the_resolver_answers_the_result_is_an_address_or_a_clear_error(answer: list[str]) -> None:
    async def lookup(hostname: str) -> list[str]:
        return answer
    try:
        got = asyncio.run(resolve_host("mac-d", SSHOptions(config=[]), lookup))
    except UnresolvedHost as exc:
        assert "gave no usable address" in str(exc)
    else:
        import ipaddress

        assert str(ipaddress.ip_address(got.ip)) == got.ip


def test_which_ranks_need_an_address() -> None:
    hosts = [Host("a"), Host("b", ["10.0.0.2"]), Host("c")]
    assert needing_address("ring", hosts) == [0, 2]
    assert needing_address("jaccl", hosts) == needing_address("nccl", hosts) == [0]
    assert needing_address("mpi", hosts) == [] and needing_address("nccl", hosts[1:]) == []


def test_fill_addresses_shows_the_choice_and_names_every_failure(tmp_path: Path) -> None:
    opts = options(tmp_path, "Host mac-a\n    HostName 10.77.0.5\n")
    hosts = [Host("localhost"), Host("localhost")]
    notes = asyncio.run(fill_addresses("ring", hosts, opts, answers({"localhost": ["127.0.0.1"]})))
    assert notes == ["addresses: localhost -> 127.0.0.1"] and [h.ips for h in hosts] == [["127.0.0.1"]] * 2
    hosts = [Host("localhost"), Host("mac-a")]
    notes = asyncio.run(fill_addresses("ring", hosts, opts, answers({"localhost": ["127.0.0.1"]})))
    assert notes[0] == "addresses: localhost -> 127.0.0.1, mac-a (HostName 10.77.0.5) -> 10.77.0.5"
    assert notes[1].startswith("warning: localhost resolved to a loopback address, which ranks on the other hosts")
    hosts = [Host("mac-x"), Host("mac-x"), Host("mac-a"), Host("mac-y")]
    with pytest.raises(LaunchError) as err:
        asyncio.run(fill_addresses("ring", hosts, opts, answers({})))
    text = str(err.value)
    assert "host 'mac-x' (rank 0, 1): it does not resolve (Name or service not known)" in text, text
    assert "host 'mac-y' (rank 3)" in text and "mac-a" not in text and "hostfile with \"ips\"" in text
