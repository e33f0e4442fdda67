"""Discovery: every host's command outputs, gathered over a :class:`Runner`, all hosts in parallel."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence, TextIO

from mlx_jupyter.configurator.runners import Runner
from mlx_jupyter.topology import CommandResult, DiscoveryError
from mlx_jupyter.topology.commands import (IP_ADDR, PROBE, SUDO_PROBE,
                                          THUNDERBOLT_DISCOVERY, UNAME, getifaddr, ip_route_get, show)
from mlx_jupyter.topology.ethernet import candidates, pick_addresses, route_targets
from mlx_jupyter.topology.netparse import IfAddr, parse_getifaddr, parse_ip_addr, parse_route_get
from mlx_jupyter.topology.system_profiler import first_line


class HostProgress(Protocol):
    """What discovery tells as each host answers (``ok``) or is found unreachable."""

    def host_done(self, host: str, ok: bool) -> None: ...


class DiscoveryProgress:
    """One self-rewriting stderr line on a terminal; per-host lines with --verbose; else silent."""

    def __init__(self, stream: TextIO, total: int, verbose: bool = False) -> None:
        self.stream, self.total, self.verbose = stream, total, verbose
        self.done = 0
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.start = time.monotonic()

    def host_done(self, host: str, ok: bool) -> None:
        self.done += 1
        if self.verbose:
            took = time.monotonic() - self.start
            self.stream.write(f"[config] {host}: {'done' if ok else 'FAILED'} after {took:.1f} s\n")
        elif self.tty:
            self.stream.write(f"\rdiscovering: {self.done}/{self.total} hosts")
            if self.done == self.total:
                self.stream.write("\n")
        self.stream.flush()


# -- discovery -------------------------------------------------------------------------------------


@dataclass
class Discovery:
    """What the hosts answered: outputs per reachable host, sudo, and the unreachable ones."""

    outputs: dict[str, dict[tuple[str, ...], CommandResult]] = field(default_factory=dict)
    sudo: dict[str, bool] = field(default_factory=dict)
    unreachable: dict[str, str] = field(default_factory=dict)  # host -> ssh's message


async def _gather_host(runner: Runner, host: str, commands: Sequence[tuple[str, ...]], disc: Discovery) -> bool:
    """Probe the host, then run sudo's probe and `commands` concurrently over its one connection."""
    probe = await runner.run(host, list(PROBE))
    if not probe.ok:
        disc.unreachable[host] = (probe.stderr or probe.stdout).strip() or f"exit {probe.rc}"
        return False
    results = await asyncio.gather(*(runner.run(host, list(c)) for c in (SUDO_PROBE, *commands)))
    disc.sudo[host] = results[0].ok
    disc.outputs[host] = {tuple(c): r for c, r in zip(commands, results[1:])}
    return True


async def discover(
    runner: Runner, hosts: Sequence[str], commands: Sequence[tuple[str, ...]], progress: HostProgress | None = None
) -> Discovery:
    """Run the commands on every host, all hosts in parallel."""
    disc = Discovery()

    async def one(host: str) -> None:
        ok = await _gather_host(runner, host, commands, disc)
        if progress:
            progress.host_done(host, ok)

    await asyncio.gather(*(one(h) for h in dict.fromkeys(hosts)))
    return disc


async def ethernet_addresses(runner: Runner, hosts: Sequence[str], disc: Discovery) -> list[str | None]:
    """Each host's address: macOS en0 then en1; Linux the address on the interface that reaches the others.

    A Linux host sharing a subnet with other hosts uses its address there; otherwise its routing
    table is asked (`ip -j -4 route get`) for the source address towards the other hosts.
    """
    ips: list[str | None] = []
    per_host: list[list[IfAddr]] = []
    linux: list[int] = []
    for i, host in enumerate(hosts):
        out = disc.outputs[host]
        if out[UNAME].stdout.strip() == "Linux":
            linux.append(i)
            ips.append(None)
            per_host.append(parse_ip_addr(host, out[IP_ADDR]))
            continue
        ip = None
        for iface in ("en0", "en1"):
            ip = ip or parse_getifaddr(host, iface, out[getifaddr(iface)])
        ips.append(ip)
        per_host.append([IfAddr("en0", ip, 32)] if ip else [])
    shared = pick_addresses(per_host)
    for i in linux:
        ips[i] = shared[i]
    reached = {i: a for i, h in enumerate(hosts) if (a := _reached_address(runner, h))}
    lost = [i for i in linux if ips[i] is None]
    found = await asyncio.gather(*(
        _route_source(runner, hosts[i], route_targets(i, per_host, ips, reached), per_host[i]) for i in lost))
    for i, ip in zip(lost, found):
        ips[i] = ip
    return ips


def _reached_address(runner: Runner, host: str) -> str | None:
    """The address ssh reached `host` at, if the runner knows it (a route target for the others)."""
    peer = getattr(runner, "peer_address", None)
    return peer(host) if callable(peer) else None


async def _route_source(runner: Runner, host: str, targets: Sequence[str], own: Sequence[IfAddr]) -> str | None:
    """The source address `host` routes from towards the first target it has a route to, else None.

    A target without a route (non-zero exit) is skipped; output that is not `ip -j` JSON is an error.
    """
    mine = {a.address for a in candidates(own)}
    tried: list[str] = []
    for target in targets:
        cmd = ip_route_get(target)
        result = await runner.run(host, list(cmd))
        if not result.ok:
            tried.append(f"{target}: exit {result.rc} {first_line(result.stderr)}".rstrip())
            continue
        source = parse_route_get(host, show(cmd), result)
        if source in mine:
            return source
        tried.append(f"{target}: from {source}, not one of its usable addresses")
    if tried:
        raise DiscoveryError(
            host, "ip -j -4 route get", "found no usable source address towards the other hosts (" + "; ".join(tried) + ")",
            "Check that this host has a route to the others (ip route), or list hosts that share a network",
        )
    return None
