"""Host names and addresses: which name means this machine, and ``ip:port`` text both ways."""

from __future__ import annotations

import ipaddress
import re
from typing import Iterable, NamedTuple

#: The names the launcher and the configurator write for this machine.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")

#: Every entry point of ours but the launch CLI refuses hosts and a hostfile together, in these words.
BOTH_HOST_SOURCES = "give hosts or a hostfile, not both (the hostfile lists the hosts)"


def hostfile_overrides(hosts: str) -> str:
    """The launch CLI's notice when both came: it follows ``mlx.launch``, whose hostfile wins."""
    return f"--hostfile overrides --hosts, as with mlx.launch: --hosts {hosts} is not used"


def bare_host(host: str) -> str:
    """``user@[::1]`` -> ``::1``: the machine part of an ssh destination, lower-cased."""
    return host.rpartition("@")[2].strip().strip("[]").lower()


def is_local(host: str) -> bool:
    """Whether ``host`` (``user@`` and brackets allowed) names this machine by a loopback name or address.

    ``localhost``, any 127.0.0.0/8 address and ``::1``; not this machine's own hostname or
    LAN addresses, which reach it through the network (and sshd) like any other host.
    """
    name = bare_host(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.split("%")[0]).is_loopback
    except ValueError:
        return False


def all_local(hosts: Iterable[str]) -> bool:
    """Whether every one of ``hosts`` is this machine (:func:`is_local`): the one test of "a local cluster"."""
    return all(is_local(h) for h in hosts)


def runs_here(ssh_name: str) -> bool:
    """Whether the launcher runs a rank for ``ssh_name`` without ssh: local, and no ``user@`` asking
    for another account (``alice@localhost`` goes through ssh)."""
    return "@" not in ssh_name and is_local(ssh_name)


class Address(NamedTuple):
    """A parsed ``ip:port``: an IP address or a host name, and a port in 1..65535."""

    host: str
    port: int

    def __str__(self) -> str:
        return format_addr(self.host, self.port)


def format_addr(ip: str, port: int) -> str:
    """``ip:port``, an IPv6 address in brackets (``[::1]:80``)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


# A DNS label as resolvers take it: letters, digits, '_' (found in /etc/hosts and
# service names), inner '-'; at most 63 characters.
_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def _host_problem(host: str) -> str:
    """Why ``host`` (unbracketed) is not an IPv4 address or a host name, or "" when it is one."""
    if is_ip(host):
        return "" if ":" not in host else "an IPv6 address needs brackets, as in [::1]:32323"
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in labels):
        return f"invalid host {host!r} (a host name is letters, digits, '-' and '_' between dots)"
    if labels[-1].isdigit():
        return f"invalid host {host!r} (not an IPv4 address, and a host name does not end in a number)"
    return ""


def is_ip(text: str) -> bool:
    """Whether ``text`` is an IPv4 or IPv6 address (an IPv6 zone such as ``%en0`` allowed)."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def split_addr(text: object) -> Address:
    """The one ``ip:port`` parser: ``"10.0.0.1:80"``, ``"[::1]:80"``, ``"mac-1.local:80"`` -> Address.

    An IPv6 address needs brackets (``"::1:80"`` is ambiguous); a port is 1..65535 in ASCII
    digits. ValueError naming the text and the fix otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not an \"ip:port\" string")
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not ip:port (as in 10.0.0.1:32323 or [::1]:32323)")
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536):
        raise ValueError(f"{text!r} has no valid port (a number in 1..65535 after the last ':')")
    if host.startswith("[") or host.endswith("]"):
        inner = host[1:-1] if host.startswith("[") and host.endswith("]") else ""
        if ":" not in inner or not is_ip(inner):
            raise ValueError(f"{text!r}: only an IPv6 address goes in brackets, as in [::1]:32323")
        return Address(inner, int(port))
    problem = _host_problem(host)
    if problem:
        raise ValueError(f"{text!r}: {problem}")
    return Address(host, int(port))
