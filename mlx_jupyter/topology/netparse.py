"""Parsers for the small network commands: networksetup, ibv_devices, ipconfig, Linux `ip -j`."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from .commands import IP_ADDR, NETWORKSETUP, CommandResult, show
from .errors import DiscoveryError
from .system_profiler import first_line, load_json

_DEVICE = re.compile(r"^[A-Za-z0-9_.:-]+$")
# macOS/BSD network interface names (en2, bridge0, utun3): the only form put into commands
_INTERFACE = re.compile(r"[a-z]{1,12}[0-9]{1,4}")
RDMA_HELP = (
    "To enable it, start each Mac in recovery mode, run `rdma_ctl enable` in Terminal, "
    "and restart (macOS 26.2 or later)"
)


def _status(result: CommandResult) -> str:
    err = first_line(result.stderr)
    return f"exit {result.rc}" + (f": {err}" if err else "")


def is_interface(name: str) -> bool:
    """Whether `name` looks like a network interface (lowercase letters, then digits)."""
    return _INTERFACE.fullmatch(name) is not None


def parse_networksetup(host: str, result: CommandResult) -> dict[str, str]:
    """Map each hardware port name ("Thunderbolt 1") to its device ("en2")."""
    command = show(NETWORKSETUP)
    if not result.stdout.strip():
        raise DiscoveryError(host, command, f"printed nothing ({_status(result)})")
    ports: dict[str, str] = {}
    name: str | None = None
    for raw in result.stdout.splitlines():
        line = raw.strip()
        if line.startswith("Hardware Port:"):
            name = line[len("Hardware Port:"):].strip() or None
        elif line.startswith("Device:") and name is not None:
            device = line[len("Device:"):].strip()
            if device:
                ports[name] = device
            name = None
    if not ports:
        raise DiscoveryError(
            host, command,
            f"lists no hardware ports ({_status(result)}); it printed: {first_line(result.stdout)!r}",
        )
    return ports


@dataclass(frozen=True)
class RdmaStatus:
    """What `ibv_devices` says about a host: enabled, disabled, absent (no command) or unknown."""

    state: str
    devices: tuple[str, ...] = ()
    detail: str = ""

    @property
    def enabled(self) -> bool:
        return self.state == "enabled"


def parse_ibv_devices(host: str, result: CommandResult) -> RdmaStatus:
    """Read the device names `ibv_devices` lists (both MLX-doc and rdma-core layouts)."""
    missing = result.rc == 127 or "command not found" in result.stderr or "not found" in first_line(result.stderr)
    if missing:
        return RdmaStatus("absent", detail=_status(result))
    if result.rc != 0:
        return RdmaStatus("unknown", detail=_status(result))
    devices: list[str] = []
    for raw in result.stdout.splitlines():
        words = raw.split()
        if not words or words[0] in ("device", "------") or set(words[0]) <= {"-"}:
            continue
        if _DEVICE.match(words[0]):
            devices.append(words[0])
    rdma = tuple(d for d in devices if d.startswith("rdma_"))
    return RdmaStatus("enabled" if rdma else "disabled", rdma)


def parse_getifaddr(host: str, iface: str, result: CommandResult) -> str | None:
    """The IPv4 address `ipconfig getifaddr IFACE` printed, or None when it has none."""
    text = result.stdout.strip()
    if not text:
        return None
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        raise DiscoveryError(
            host, f"ipconfig getifaddr {iface}", f"printed {first_line(text)!r}, not an IPv4 address"
        ) from None


@dataclass(frozen=True)
class IfAddr:
    """One IPv4 address of a Linux interface."""

    ifname: str
    address: str
    prefixlen: int
    up: bool = True
    loopback: bool = False

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{self.address}/{self.prefixlen}", strict=False)


def parse_ip_addr(host: str, result: CommandResult) -> list[IfAddr]:
    """The IPv4 addresses of `ip -j addr` output, in the order listed."""
    command = show(IP_ADDR)
    data = load_json(host, command, result)
    if not isinstance(data, list):
        raise DiscoveryError(host, command, "printed JSON that is not a list of interfaces")
    out: list[IfAddr] = []
    for link in data:
        if not isinstance(link, dict):
            raise DiscoveryError(host, command, "an interface entry is not an object")
        name = link.get("ifname")
        flags = link.get("flags", [])
        infos = link.get("addr_info", [])
        if not isinstance(name, str) or not isinstance(flags, list) or not isinstance(infos, list):
            raise DiscoveryError(host, command, "an interface entry lacks ifname, flags or addr_info")
        for info in infos:
            addr = _ifaddr(name, flags, info)
            if addr is not None:
                out.append(addr)
    return out


def _ifaddr(name: str, flags: list[Any], info: Any) -> IfAddr | None:
    if not isinstance(info, dict) or info.get("family") != "inet":
        return None
    local, plen = info.get("local"), info.get("prefixlen")
    if not isinstance(local, str) or isinstance(plen, bool) or not isinstance(plen, int) or not 0 <= plen <= 32:
        return None
    try:
        address = ipaddress.IPv4Address(local)
    except ValueError:
        return None
    return IfAddr(name, str(address), plen, "UP" in flags, "LOOPBACK" in flags or address.is_loopback)


def parse_route_get(host: str, command: str, result: CommandResult) -> str:
    """The source address (`prefsrc`) of `ip -j route get` output."""
    data = load_json(host, command, result)
    routes = data if isinstance(data, list) else [data]
    for route in routes:
        if isinstance(route, dict) and isinstance(route.get("prefsrc"), str):
            try:
                return str(ipaddress.IPv4Address(route["prefsrc"]))
            except ValueError:
                break
    raise DiscoveryError(host, command, "printed no route with an IPv4 prefsrc")
