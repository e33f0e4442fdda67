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
import sys
from typing import Any, Mapping, Sequence, TextIO

from mlx_jupyter.vocab import backends
from mlx_jupyter.configurator import measure
from mlx_jupyter.configurator.discovery import DiscoveryProgress, discover, ethernet_addresses
from mlx_jupyter.configurator.runners import COMMAND_TIMEOUT, CONNECT_TIMEOUT, Runner, SSHRunner
from mlx_jupyter.configurator.setup import apply_setup, hostfile_text, hosts_to_set_up
from mlx_jupyter.topology.choice import CONFIG_BACKENDS
from mlx_jupyter.topology import DiscoveryError, PlanError, Topology, TopologyError
from mlx_jupyter.topology.commands import ETHERNET_DISCOVERY, THUNDERBOLT_DISCOVERY

# -- the command line ------------------------------------------------------------------------------


EXAMPLES = """\
examples:
  mlx-jupyter config --hosts mac1,mac2,mac3,mac4
      read the cabling, pick a backend, print each host's setup commands and the hostfile (changes nothing)
  mlx-jupyter config --hosts mac1,mac2,mac3,mac4 --auto-setup --output-hostfile tb.json
      also run the setup over ssh where sudo needs no password, and write tb.json
  mlx-jupyter config --hosts mac1,mac2,mac3,mac4 --auto-setup --measure
      then check every cable: Gb/s each way and round trip, slow or lopsided cables flagged
  mlx-jupyter config --hosts mac1,mac2 --over ethernet --output-hostfile ring.json
      no Thunderbolt: each host's ordinary-network address, for the ring backend
  mlx-jupyter launch --hostfile tb.json -- python train.py
      then run on the hosts (see mlx-jupyter launch --help)
"""


def parser() -> argparse.ArgumentParser:
    from mlx_jupyter.suggest import ArgumentParser

    p = ArgumentParser(
        prog="mlx-jupyter config",
        description="Discover Thunderbolt cabling, plan addresses, set up the hosts and write a hostfile.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--hosts", help="comma-separated ssh names, in rank order")
    where.add_argument("--hostfile", help="a JSON hostfile whose ssh names to use")
    p.add_argument("--over", choices=["thunderbolt", "ethernet"], default="thunderbolt",
                   help="the network the ranks talk over: thunderbolt (default) discovers the cables and plans a "
                        "/30 subnet per cable; ethernet takes each host's address on en0/en1 (Linux: its "
                        "interfaces) for a ring hostfile")
    p.add_argument("--backend", choices=CONFIG_BACKENDS, default=None,
                   help="default: the best the cabling supports (RDMA only over Thunderbolt 5)")
    p.add_argument("--auto-setup", dest="auto_setup", action="store_true", default=False,
                   help="run the setup commands over ssh on hosts with passwordless sudo")
    p.add_argument("--no-auto-setup", dest="auto_setup", action="store_false", help="only print them (default)")
    p.add_argument("--output-hostfile", help="write the hostfile here instead of printing it")
    p.add_argument("--hostfile-format", choices=["object", "list"], default="object",
                   help="object: {backend, envs, hosts} (MLX 0.32, mlx-jupyter); list: the plain host list "
                        "MLX 0.29-0.31 read (backend and envs left out)")
    p.add_argument("--partial-setup", action="store_true",
                   help="with --auto-setup: set up the hosts with passwordless sudo even if others lack it")
    p.add_argument("--dot", action="store_true", help="print the cabling as GraphViz DOT and stop")
    p.add_argument("--env", action="append", default=[], metavar="K=V", help="saved into the hostfile (repeatable)")
    p.add_argument("--ignore-unreachable", action="store_true", help="leave out hosts ssh cannot reach")
    p.add_argument("--verbose", action="store_true", help="log each step to stderr")
    from mlx_jupyter.net import ssh

    ssh.add_arguments(p, "ssh (as for mlx-jupyter launch)", CONNECT_TIMEOUT, keepalive=False)
    measure.add_arguments(p)
    return p


def ssh_options(args: argparse.Namespace) -> Any:
    """The `SSHOptions` the ssh flags ask for."""
    from mlx_jupyter.net.ssh import options_from_args

    return options_from_args(args)


def host_names(args: argparse.Namespace, err: TextIO | None = None) -> list[str]:
    """The ssh names from --hosts or --hostfile (read as every entry point reads one; its warnings to ``err``)."""
    from mlx_jupyter import hostfile

    if args.hostfile:
        read = hostfile.read_hostfile(args.hostfile)
        hosts = read.hosts
        for w in read.warnings:
            (err or sys.stderr).write(f"warning: {w}\n")
    else:
        hosts = hostfile.parse_host_list(args.hosts)
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


def _print_setup(out: TextIO, host: str, lines: Sequence[str], why: str) -> None:
    title = f"Setup for {host} ({why})"
    out.write(f"{title}\n{'=' * len(title)}\n" + "\n".join(lines) + "\n\n")


def save_hostfile(data: Mapping[str, Any], path: str | None, out: TextIO, err: TextIO, form: str = "object") -> None:
    text, warnings = hostfile_text(data, form)
    for w in warnings:
        err.write(f"warning: {w}\n")
    if path:
        with open(path, "w") as fh:
            fh.write(text)
        err.write(f"wrote {path} (backend {data['backend'] or 'unset'}, {len(data['hosts'])} hosts)\n")
    else:
        out.write(f"Hostfile\n========\n{text}")


async def configure(args: argparse.Namespace, runner: Runner, out: TextIO, err: TextIO) -> int:
    """The whole command once arguments are parsed; returns the exit code."""
    names = host_names(args, err)
    envs = env_items(args.env, err)
    commands = THUNDERBOLT_DISCOVERY if args.over == "thunderbolt" else ETHERNET_DISCOVERY
    try:
        check = measure.options_from_args(args)  # None without --measure; refused before any ssh
    except ValueError as exc:
        err.write(f"error: {exc}\n")
        return 2
    disc = await discover(runner, names, commands, DiscoveryProgress(err, len(names), args.verbose))
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
        if args.backend and backends.get(args.backend).rdma:   # jaccl, jaccl-ring
            err.write(f"error: {args.backend} needs RDMA over Thunderbolt; use --over thunderbolt\n")
            return 2
        ips = await ethernet_addresses(runner, names, disc)
        missing = [n for n, ip in zip(names, ips) if not ip]
        if missing:
            err.write(f"error: no IPv4 address found on {', '.join(missing)} "
                      "(`ipconfig getifaddr en0`/`en1` on macOS, `ip -j -4 addr show` on Linux)\n")
            return 1
        from mlx_jupyter.topology.hostfile_plan import ethernet_hostfile

        save_hostfile(ethernet_hostfile(names, ips, args.backend or "", envs), args.output_hostfile, out, err, args.hostfile_format)
        return 0
    topo = Topology.from_outputs(names, disc.outputs, disc.sudo)
    for w in topo.warnings:
        err.write(f"warning: {w}\n")
    if args.dot:
        out.write(topo.to_dot())
        return 0
    choice = topo.choose_backend(args.backend, envs)
    err.write(f"backend: {choice.backend} — {choice.reason}\n")
    for w in choice.warnings:
        err.write(f"warning: {w}\n")
    status = await setup_hosts(topo, runner, args.auto_setup, out, err, args.partial_setup)
    save_hostfile(choice.hostfile, args.output_hostfile, out, err, args.hostfile_format)
    if check is not None:
        allowed, _ = hosts_to_set_up({h.name: h.sudo for h in topo.hosts}, args.auto_setup, args.partial_setup)
        unset = [n for n in topo.names if n not in allowed]
        if unset:
            err.write(f"warning: the setup was not applied to {', '.join(unset)} here: the cable check needs the "
                      "plan's addresses on every cable, and fails where they are not set up yet\n")
        report = await measure.measure_topology(topo, runner, check, out, err, args.verbose)
        status = status or (0 if report.ok else 1)
    return status


async def setup_hosts(topo: Topology, runner: Runner, auto: bool, out: TextIO, err: TextIO,
                      partial: bool = False) -> int:
    """Run the setup where allowed (see `hosts_to_set_up`), print it for the other hosts."""
    commands = topo.setup_commands()
    allowed, why = hosts_to_set_up({h.name: h.sudo for h in topo.hosts}, auto, partial)
    for host in topo.hosts:
        if host.name in why:
            _print_setup(out, host.name, commands[host.name], why[host.name])
    if not allowed:
        return 0
    err.write(f"setting up {', '.join(n for n in topo.names if n in allowed)} over ssh\n")
    failures = await apply_setup(runner, {h: commands[h] for h in topo.names if h in allowed})
    for name, problems in failures.items():
        err.write(f"error: setup failed on {name}:\n  " + "\n  ".join(problems) + "\n")
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
    # a cable check's commands last as long as its per-cable timeout
    timeout = max(COMMAND_TIMEOUT, args.measure_timeout + 10)
    active: Runner = SSHRunner(options=ssh_options(args), command_timeout=timeout) if runner is None else runner
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
