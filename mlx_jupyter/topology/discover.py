"""Turn one host's raw command outputs into a `Host` (pure: the outputs come in as data)."""

from __future__ import annotations

from typing import Mapping

from .commands import IBV_DEVICES, NETWORKSETUP, SYSTEM_PROFILER, CommandResult, getifaddr, show
from .errors import DiscoveryError
from .model import MacHost, Port, natural_key
from .netparse import is_interface, parse_getifaddr, parse_ibv_devices, parse_networksetup
from .system_profiler import Bus, parse_system_profiler

Outputs = Mapping[tuple[str, ...], CommandResult]


def ports_of(host: str, buses: list[Bus], hardware_ports: dict[str, str]) -> tuple[list[Port], list[str]]:
    """Give each bus its interface ("Thunderbolt N" -> enX); sorted by interface."""
    ports: list[Port] = []
    warnings: list[str] = []
    for bus in buses:
        label = f"Thunderbolt {bus.receptacle}"
        iface = hardware_ports.get(label)
        if iface is None:
            if bus.peer is not None:
                raise DiscoveryError(
                    host, show(NETWORKSETUP),
                    f"lists no hardware port for Thunderbolt receptacle {bus.receptacle} ({label}), "
                    f"which system_profiler shows connected to {bus.peer.name or bus.peer.uuid}",
                    "Re-create the Thunderbolt network services in System Settings > Network, or check the host",
                )
            warnings.append(f"{host}: `{show(NETWORKSETUP)}` has no {label}; that idle port is skipped")
            continue
        if not is_interface(iface):
            # it would end up in `sudo ifconfig ...` lines and in the hostfile's rdma_<iface>
            raise DiscoveryError(
                host, show(NETWORKSETUP),
                f"gives {label} the device {iface!r}, which is not a network interface name",
                "Expected lowercase letters then digits, like en2; check what the command prints on that host",
            )
        ports.append(Port(iface, bus.uuid, bus.receptacle or "", bus.link_gbps, bus.max_gbps, bus.peer,
                          bus.peers[1:]))
    ports.sort(key=lambda p: natural_key(p.iface))
    return ports, warnings


def ethernet_ip(host: str, outputs: Outputs) -> str | None:
    """The host's address on en0, else en1 (macOS `ipconfig getifaddr`), else None."""
    for iface in ("en0", "en1"):
        result = outputs.get(getifaddr(iface))
        if result is not None:
            ip = parse_getifaddr(host, iface, result)
            if ip:
                return ip
    return None


def host_from_outputs(host: str, outputs: Outputs, sudo: bool | None = None) -> tuple[MacHost, list[str]]:
    """Parse a Mac's recorded or live outputs into a Host, plus warnings."""
    missing = [show(c) for c in (SYSTEM_PROFILER, NETWORKSETUP) if c not in outputs]
    if missing:
        raise DiscoveryError(host, missing[0], "was not run (no output recorded)")
    buses, warnings = parse_system_profiler(host, outputs[SYSTEM_PROFILER])
    hardware_ports = parse_networksetup(host, outputs[NETWORKSETUP])
    ports, more = ports_of(host, buses, hardware_ports)
    ibv = outputs.get(IBV_DEVICES)
    rdma = parse_ibv_devices(host, ibv) if ibv is not None else None
    machine = next((b.machine for b in buses if b.machine), None)
    return MacHost(host, tuple(ports), rdma, ethernet_ip(host, outputs), sudo, machine), warnings + more
