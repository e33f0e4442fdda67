"""Host names to the addresses ranks use, as ssh would reach them: the ssh config's HostName, then
the system's resolver (DNS, /etc/hosts, mDNS)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass
from typing import Awaitable, Callable, Optional

from mlx_jupyter.net import ssh
from mlx_jupyter.vocab.hosts import bare_host, runs_here

#: A lookup of a host name: its addresses (raises OSError when it has none).
Lookup = Callable[[str], Awaitable[list[str]]]

LOOKUP_TIMEOUT = 5.0


class UnresolvedHost(ValueError):
    """A host name that neither the ssh config nor the resolver turns into an address (the message
    says why, to follow the name: "its HostName 'x' (from the ssh config) does not resolve (...)")."""


@dataclass(frozen=True)
class Address:
    """Where ``name`` (an ssh destination) is: its HostName after the ssh config, and the address chosen."""

    name: str
    hostname: str
    ip: str

    def describe(self) -> str:
        """``mac1 -> 192.168.1.5`` (``mac1 (HostName mac1.lan) -> ...`` when the ssh config renamed it)."""
        via = f" (HostName {self.hostname})" if self.hostname != bare_host(self.name) else ""
        return f"{self.name}{via} -> {self.ip}"


def _ip(text: str) -> Optional[str]:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


async def system_lookup(hostname: str) -> list[str]:
    """The resolver's addresses for ``hostname``, IPv4 first (ring and JACCL dial the first)."""
    infos = await asyncio.get_running_loop().getaddrinfo(hostname, None, type=socket.SOCK_STREAM)
    found = [str(info[4][0]) for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)]
    ordered = sorted(dict.fromkeys(found), key=lambda a: ":" in a)   # stable: IPv4 before IPv6
    if not ordered:
        raise OSError(f"no IPv4 or IPv6 address for {hostname!r}")
    return ordered


async def resolve_host(name: str, options: Optional[ssh.SSHOptions] = None, lookup: Lookup = system_lookup,
                       timeout: float = LOOKUP_TIMEOUT) -> Address:
    """``name``'s address: an IP is itself; otherwise its ssh config HostName (unless its ranks run here
    without ssh: ``localhost``), looked up if not an IP."""
    bare = bare_host(name)
    if (ip := _ip(bare.split("%")[0])) is not None:
        return Address(name, bare, ip)
    try:
        hostname = bare if runs_here(name) else ssh.resolve(name, options or ssh.SSHOptions()).host
    except ssh.SSHError as exc:
        raise UnresolvedHost(str(exc)) from None
    if (ip := _ip(hostname)) is not None:
        return Address(name, hostname, ip)
    via = f"its HostName {hostname!r} (from the ssh config)" if hostname != bare else "it"
    try:
        addresses = await asyncio.wait_for(lookup(hostname), timeout)
    except asyncio.TimeoutError:
        raise UnresolvedHost(f"{via}: no answer from the resolver within {timeout:g} s") from None
    except (OSError, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UnresolvedHost(f"{via} does not resolve ({reason})") from None
    ip = next((a for a in (_ip(x) for x in addresses) if a is not None), None)
    if ip is None:
        raise UnresolvedHost(f"{via}: the resolver gave no usable address")
    return Address(name, hostname, ip)


def source_ip_toward(ip: str) -> str:
    """The address of this machine that traffic to ``ip`` leaves from (the routing table's choice).

    A UDP socket's connect sends nothing: the kernel only picks the route and the source address.
    """
    import socket

    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((ip, 9))
        source: str = s.getsockname()[0]
        return source
