"""The remote commands discovery runs, and the shape of their results."""

from __future__ import annotations

from dataclasses import dataclass

SYSTEM_PROFILER = ("system_profiler", "SPThunderboltDataType", "-json")
NETWORKSETUP = ("networksetup", "-listallhardwareports")
IBV_DEVICES = ("ibv_devices",)
PROBE = ("echo", "success")
SUDO_PROBE = ("sudo", "-n", "true")
UNAME = ("uname", "-s")
IP_ADDR = ("ip", "-j", "-4", "addr", "show")


def getifaddr(iface: str) -> tuple[str, ...]:
    """`ipconfig getifaddr IFACE`: the IPv4 address of a macOS interface."""
    return ("ipconfig", "getifaddr", iface)


#: What discovery runs on each host for `--over thunderbolt`: the one list (config, widget, recordings).
THUNDERBOLT_DISCOVERY = (SYSTEM_PROFILER, NETWORKSETUP, IBV_DEVICES, getifaddr("en0"), getifaddr("en1"))
#: ... and for `--over ethernet` (macOS answers ipconfig, Linux `ip`).
ETHERNET_DISCOVERY = (UNAME, getifaddr("en0"), getifaddr("en1"), IP_ADDR)


def ip_route_get(address: str) -> tuple[str, ...]:
    """`ip -j -4 route get ADDRESS`: which source address Linux would use to reach ADDRESS."""
    return ("ip", "-j", "-4", "route", "get", address)


def show(argv: tuple[str, ...] | list[str]) -> str:
    """A command as it is written in messages."""
    return " ".join(argv)


@dataclass(frozen=True)
class CommandResult:
    """Exit status and decoded output of one remote command."""

    rc: int
    stdout: str
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0
