"""Host names and addresses: which name means this machine, and ``ip:port`` text both ways."""

from __future__ import annotations

import ipaddress
from typing import Iterable

from mlx_jupyter.net.ports import DEFAULT_STARTING_PORT

#: The names the launcher and the configurator write for this machine.
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


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


def format_addr(ip: str, port: int) -> str:
    """``ip:port``, an IPv6 address in brackets (``[::1]:80``)."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def split_addr(text: str) -> tuple[str, int]:
    """``"[::1]:80"`` / ``"10.0.0.1:80"`` / ``"mac-1:80"`` -> (host, port); ValueError naming the text otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not an \"ip:port\" string")
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: an IPv6 address needs brackets, as in [::1]:{DEFAULT_STARTING_PORT}")
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not ip:port (port 1..65535)")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not all(part and part.isascii() and part.replace("-", "").replace("_", "").isalnum()
                   for part in host.split(".")):
            raise ValueError(f"{text!r} has an invalid host {host!r}") from None
    return host, int(port)
