"""`mlx-jupyter config`: discover the cabling, plan addresses, set up the hosts, write a hostfile.

Thin I/O over the pure `mlx_jupyter.topology` package. Every remote command goes
through a `Runner` (`async run(host, argv) -> CommandResult`); the default one
is `SSHRunner`, over `mlx_jupyter.net.ssh` (one connection per host, reused for all
of that host's commands). All hosts are discovered in parallel. Nothing here
reads stdin.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence, TextIO, Union

from mlx_jupyter.topology import CommandResult, DiscoveryError, PlanError, Topology, TopologyError
from mlx_jupyter.topology.commands import (
    IBV_DEVICES, IP_ADDR, NETWORKSETUP, PROBE, SUDO_PROBE, SYSTEM_PROFILER, UNAME, getifaddr, ip_route_get, show,
)
from mlx_jupyter.topology.addressing import BRIDGE_DOWN, SETUP_PROGRAMS, SetupLine
from mlx_jupyter.topology.ethernet import candidates, pick_addresses, route_targets
from mlx_jupyter.topology.netparse import IfAddr, parse_getifaddr, parse_ip_addr, parse_route_get
from mlx_jupyter.topology.system_profiler import first_line

THUNDERBOLT_COMMANDS = (SYSTEM_PROFILER, NETWORKSETUP, IBV_DEVICES, getifaddr("en0"), getifaddr("en1"))
COMMAND_TIMEOUT = 60.0  # system_profiler takes a second or two; anything far beyond is a hung host
CONNECT_TIMEOUT = 5.0


class Runner(Protocol):
    """Runs one command on one host; implementations keep one connection per host."""

    async def run(self, host: str, argv: Sequence[str]) -> CommandResult: ...


# -- the ssh adapter ------------------------------------------------------------------------------


class SSHRunner:
    """A `Runner` over `mlx_jupyter.net.ssh`: connects lazily, once per host, and reuses the connection."""

    def __init__(self, connect_timeout: float = CONNECT_TIMEOUT, command_timeout: float = COMMAND_TIMEOUT,
                 options: Any = None) -> None:
        """`options` (an `mlx_jupyter.net.ssh.SSHOptions`) replaces the defaults, connect timeout included."""
        from mlx_jupyter.net import ssh

        self._ssh = ssh
        self._opts = options or ssh.SSHOptions(connect_timeout=connect_timeout)
        self._timeout = command_timeout
        self._conns: dict[str, Any] = {}
        self._failed: dict[str, Exception] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def _connection(self, host: str) -> Any:
        async with self._locks.setdefault(host, asyncio.Lock()):
            if host in self._failed:  # do not wait for the timeout again
                raise self._failed[host]
            if host not in self._conns:
                try:
                    self._conns[host] = await self._ssh.connect(host, self._opts)
                except self._ssh.SSHError as exc:
                    self._failed[host] = exc
                    raise
            return self._conns[host]

    async def run(self, host: str, argv: Sequence[str]) -> CommandResult:
        """Exit 255 with ssh's complaint on stderr when the host cannot be reached, as ssh(1) does."""
        try:
            conn = await self._connection(host)
            result = await self._ssh.run(conn, self._ssh.join(argv), self._timeout, host)
        except self._ssh.SSHError as exc:
            return CommandResult(255, "", f"{exc}\n")
        return CommandResult(
            result.exit_status if result.exit_status is not None else 255,
            _text(result.stdout),
            _text(result.stderr),
        )

    def peer_address(self, host: str) -> str | None:
        """The IP address the connection to `host` reached, once connected (None before, or if unknown)."""
        conn = self._conns.get(host)
        peer = conn.get_extra_info("peername") if conn is not None else None
        return peer[0] if isinstance(peer, tuple) and peer and isinstance(peer[0], str) else None

    async def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()


def _text(data: Any) -> str:
    if data is None:
        return ""
    return data.decode("utf-8", errors="replace") if isinstance(data, bytes) else str(data)


# -- progress --------------------------------------------------------------------------------------


class Progress:
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
    runner: Runner, hosts: Sequence[str], commands: Sequence[tuple[str, ...]], progress: Progress | None = None
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


# -- setup ---------------------------------------------------------------------------------------

SetupCommand = Union[SetupLine, Sequence[str]]


def setup_argv(command: SetupCommand) -> tuple[str, ...]:
    """The argv of a planned setup command (a `SetupLine` or an argv); plain text is refused, never split."""
    if isinstance(command, SetupLine):
        argv = command.argv
    elif isinstance(command, str):
        raise TypeError(f"setup commands are run from their argv, not from text: {command!r}")
    else:
        argv = tuple(command)
    if not argv or argv[0] not in SETUP_PROGRAMS:
        raise ValueError(f"not a setup command (only {', '.join(SETUP_PROGRAMS)}): {argv!r}")
    return argv


async def apply_setup(runner: Runner, commands: Mapping[str, Sequence[SetupCommand]]) -> dict[str, list[str]]:
    """Run each host's setup commands in order with `sudo -n` (hosts in parallel); return failures per host."""
    planned = {h: [setup_argv(c) for c in lines] for h, lines in commands.items()}  # refuse before running any

    async def one(host: str, argvs: list[tuple[str, ...]]) -> list[str]:
        failures = []
        for argv in argvs:
            run = ("sudo", "-n", *argv)  # -n: fail instead of prompting for a password
            result = await runner.run(host, list(run))
            if not result.ok and argv != BRIDGE_DOWN:  # a deleted Thunderbolt Bridge is fine
                failures.append(f"`{shlex.join(run)}` exited {result.rc}: {first_line(result.stderr or result.stdout)}")
        return failures

    results = await asyncio.gather(*(one(h, c) for h, c in planned.items()))
    return {h: f for h, f in zip(planned, results) if f}


# -- the command line ------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mlx-jupyter config",
        description="Discover Thunderbolt cabling, plan addresses, set up the hosts and write a hostfile.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--hosts", help="comma-separated ssh names, in rank order")
    where.add_argument("--hostfile", help="a JSON hostfile whose ssh names to use")
    p.add_argument("--over", choices=["thunderbolt", "ethernet"], default="thunderbolt")
    p.add_argument("--backend", choices=["ring", "jaccl", "jaccl-ring"], default=None,
                   help="default: the best the cabling supports (RDMA only over Thunderbolt 5)")
    p.add_argument("--auto-setup", dest="auto_setup", action="store_true", default=False,
                   help="run the setup commands over ssh on hosts with passwordless sudo")
    p.add_argument("--no-auto-setup", dest="auto_setup", action="store_false", help="only print them (default)")
    p.add_argument("--output-hostfile", help="write the hostfile here instead of printing it")
    p.add_argument("--dot", action="store_true", help="print the cabling as GraphViz DOT and stop")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="saved into the hostfile (repeatable)")
    p.add_argument("--ignore-unreachable", action="store_true", help="leave out hosts ssh cannot reach")
    p.add_argument("--verbose", action="store_true", help="log each step to stderr")
    from mlx_jupyter.net import ssh

    ssh.add_arguments(p, "ssh (as for mlx-jupyter launch)", CONNECT_TIMEOUT, keepalive=False)
    return p


def ssh_options(args: argparse.Namespace) -> Any:
    """The `SSHOptions` the ssh flags ask for."""
    from mlx_jupyter.net.ssh import options_from_args

    return options_from_args(args)


def host_names(args: argparse.Namespace) -> list[str]:
    """The ssh names from --hosts or --hostfile (validated by the launcher's hostfile module)."""
    from mlx_jupyter import hostfile

    hosts = hostfile.read_hostfile(args.hostfile).hosts if args.hostfile else hostfile.parse_host_list(args.hosts)
    names = [h.ssh for h in hosts]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise hostfile.HostfileError(f"host(s) listed twice: {', '.join(dupes)}")
    return names


def env_items(items: Sequence[str], err: TextIO) -> list[str]:
    """Valid `K=V` items, warning about the others."""
    from mlx_jupyter.hostfile import parse_env

    env, warnings = parse_env(items)
    for w in warnings:
        err.write(f"warning: {w}\n")
    return [f"{k}={v}" for k, v in env.items()]


def _print_setup(out: TextIO, host: str, lines: list[str], why: str) -> None:
    title = f"Setup for {host} ({why})"
    out.write(f"{title}\n{'=' * len(title)}\n" + "\n".join(lines) + "\n\n")


def save_hostfile(data: dict, path: str | None, out: TextIO, err: TextIO) -> None:
    text = json.dumps(data, indent=4)
    if path:
        with open(path, "w") as fh:
            fh.write(text + "\n")
        err.write(f"wrote {path} (backend {data['backend'] or 'unset'}, {len(data['hosts'])} hosts)\n")
    else:
        out.write(f"Hostfile\n========\n{text}\n")


async def configure(args: argparse.Namespace, runner: Runner, out: TextIO, err: TextIO) -> int:
    """The whole command once arguments are parsed; returns the exit code."""
    names = host_names(args)
    envs = env_items(args.env, err)
    commands = THUNDERBOLT_COMMANDS if args.over == "thunderbolt" else (UNAME, getifaddr("en0"), getifaddr("en1"), IP_ADDR)
    disc = await discover(runner, names, commands, Progress(err, len(names), args.verbose))
    if disc.unreachable:
        listing = "\n".join(f"  - {h}: {msg}" for h, msg in disc.unreachable.items())
        if not args.ignore_unreachable:
            err.write(f"error: `ssh` could not reach these hosts:\n{listing}\n"
                      "Check password-less ssh (ssh -o BatchMode=yes HOST), or pass --ignore-unreachable.\n")
            return 1
        err.write(f"warning: leaving out unreachable hosts:\n{listing}\n")
        names = [n for n in names if n not in disc.unreachable]
        if not names:
            err.write("error: no host is reachable\n")
            return 1
    if args.over == "ethernet":
        if args.backend in ("jaccl", "jaccl-ring"):
            err.write(f"error: {args.backend} needs RDMA over Thunderbolt; use --over thunderbolt\n")
            return 2
        ips = await ethernet_addresses(runner, names, disc)
        missing = [n for n, ip in zip(names, ips) if not ip]
        if missing:
            err.write(f"error: no IPv4 address found on {', '.join(missing)} "
                      "(`ipconfig getifaddr en0`/`en1` on macOS, `ip -j -4 addr show` on Linux)\n")
            return 1
        from mlx_jupyter.topology.hostfiles import ethernet_hostfile

        save_hostfile(ethernet_hostfile(names, ips, args.backend or "", envs), args.output_hostfile, out, err)
        return 0
    topo = Topology.from_outputs(names, disc.outputs, disc.sudo)
    for w in topo.warnings:
        err.write(f"warning: {w}\n")
    if args.dot:
        out.write(topo.to_dot())
        return 0
    choice = topo.choose_backend(args.backend, envs)
    err.write(f"backend: {choice.backend} — {choice.reason}\n")
    status = await setup_hosts(topo, runner, args.auto_setup, out, err)
    save_hostfile(choice.hostfile, args.output_hostfile, out, err)
    return status


async def setup_hosts(topo: Topology, runner: Runner, auto: bool, out: TextIO, err: TextIO) -> int:
    """Run the setup where allowed (auto-setup and passwordless sudo), print it for the other hosts."""
    commands = topo.setup_commands()
    allowed = {h.name for h in topo.hosts if auto and h.sudo}
    for host in topo.hosts:
        if host.name not in allowed:
            why = "no passwordless sudo: run these by hand" if auto else "run these, or pass --auto-setup"
            _print_setup(out, host.name, commands[host.name], why)
    if not allowed:
        return 0
    err.write(f"setting up {', '.join(n for n in topo.names if n in allowed)} over ssh\n")
    failures = await apply_setup(runner, {h: commands[h] for h in topo.names if h in allowed})
    for host, problems in failures.items():
        err.write(f"error: setup failed on {host}:\n  " + "\n  ".join(problems) + "\n")
    return 1 if failures else 0


def main(argv: list[str], *, runner: Runner | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Entry point of `mlx-jupyter config`; `runner` replaces ssh (tests, recordings)."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage error
        return int(exc.code or 0)
    return asyncio.run(_main(args, runner, out, err))


async def _main(args: argparse.Namespace, runner: Runner | None, out: TextIO, err: TextIO) -> int:
    from mlx_jupyter.hostfile import HostfileError

    own = runner is None
    active: Runner = SSHRunner(options=ssh_options(args)) if runner is None else runner
    try:
        return await configure(args, active, out, err)
    except (DiscoveryError, PlanError, TopologyError, HostfileError) as exc:
        err.write(f"error: {exc}\n")
        return 1
    except OSError as exc:  # writing the hostfile
        err.write(f"error: {exc}\n")
        return 1
    finally:
        if own:
            await active.close()  # type: ignore[attr-defined]
