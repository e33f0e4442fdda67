"""Cable check, the I/O part: run the agent at both ends of each cable over the `config` runner (ssh).

`mlx-jupyter config --measure` and the topology widget's Check cables button come here;
the pure part (rounds, Gb/s, flags, report) is `mlx_jupyter.topology.cablecheck`.

For each cable, `serve` runs on its b end (listening on the b address) and `send` on its a
end (bound to the a address), both as `python3 -c <agent source>` so the hosts need only a
Python 3. Cables that share no host run at once (`topology.cablecheck.schedule`); every
cable is bounded by its timeout and the whole check by a budget.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Sequence, TextIO

from mlx_jupyter.configurator.runners import Runner
from mlx_jupyter.topology import CommandResult
from mlx_jupyter.topology.cablecheck import (
    ASYMMETRY_FACTOR, SLOW_FRACTION, AgentOutputError, CableResult, Report, Target, Thresholds, judge,
    parse_transfer, schedule,
)
from mlx_jupyter.topology.system_profiler import first_line

AGENT_SOURCE = (Path(__file__).parent / "measure_agent.py").read_text()
PORTS = (40000, 60999)  # where a server's port is drawn from; a taken one is redrawn
PORT_TRIES = 4
GRACE = 5.0  # ssh's own time on top of the agents' timeout
#: In a cable's error when an end could not bind its plan address (EADDRNOTAVAIL): the setup is missing there.
NOT_SET_UP = "apply the setup first"


@dataclass
class CheckOptions:
    """How long and how much to send, the bounds, the remote Python, and the flagging thresholds."""

    seconds: float = 1.0  # per direction
    max_bytes: int = 8 << 30  # per direction
    cable_timeout: float = 30.0
    budget: float = 300.0
    python: str = "python3"
    pings: int = 20
    thresholds: Thresholds = field(default_factory=Thresholds)


class CableCheckProgress(Protocol):
    def cable_done(self, result: CableResult, done: int, total: int) -> None: ...


class TextProgress:
    """A self-rewriting stderr line on a terminal (as `config.DiscoveryProgress`); a line per cable with verbose."""

    def __init__(self, stream: TextIO, verbose: bool = False) -> None:
        self.stream, self.verbose = stream, verbose
        self.tty = bool(getattr(stream, "isatty", lambda: False)())

    def cable_done(self, result: CableResult, done: int, total: int) -> None:
        if self.verbose:
            self.stream.write(f"[measure] {result.line()}\n")
        elif self.tty:
            self.stream.write(f"\rmeasuring cables: {done}/{total}" + ("\n" if done == total else ""))
        self.stream.flush()


def agent_argv(python: str, role: str, **opts: Any) -> list[str]:
    """`python3 -c <agent> serve|send --key value ...` (the runner quotes every word); the token goes
    on the agent's stdin (:func:`_run`), never here."""
    argv = [python, "-c", AGENT_SOURCE, role, "--exit-on-eof"]
    for key, value in opts.items():
        argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def _why(host: str, role: str, address: str, res: CommandResult, python: str) -> str:
    """A failed agent run as one line naming the host."""
    text = first_line(res.stderr) or first_line(res.stdout)
    if res.rc == 255:
        return f"{host}: cannot reach it over ssh: {text or 'exit 255'}"
    if "assign requested address" in res.stderr:   # EADDRNOTAVAIL: the plan's address is not on this host
        return (f"{host} ({role} on {address}): that address is not on {host} yet: {NOT_SET_UP} "
                "(Apply setup, or mlx-jupyter config --auto-setup)")
    if res.rc == 127:
        return (f"{host}: {python!r} not found ({text}); name the remote Python with --measure-python "
                "(CheckOptions(python=...) in the widget)")
    return f"{host} ({role} on {address}): {text or f'exit {res.rc}'}"


async def _run(runner: Runner, host: str, argv: list[str], token: str) -> CommandResult:
    """The runner's result (the agent reads ``token`` from its stdin); anything it raises becomes a failed
    result (named by `_why`), never a traceback."""
    try:
        return await runner.run(host, argv, stdin=token + "\n")
    except Exception as exc:  # noqa: BLE001 - a runner's own failure, reported on the cable
        return CommandResult(255, "", f"{type(exc).__name__}: {exc}\n")


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def measure_cable(runner: Runner, t: Target, opts: CheckOptions, deadline: float) -> CableResult:
    """Measure one cable both ways; never raises: a failure is the result's `error`."""
    for _ in range(PORT_TRIES):
        left = min(opts.cable_timeout, deadline - time.monotonic())
        if left < 1.0:
            return CableResult(t, error=f"not measured: the check's time budget ({opts.budget:g} s) ran out")
        end = time.monotonic() + left + GRACE
        port = secrets.SystemRandom().randint(*PORTS)
        token = secrets.token_hex(16)
        common = dict(port=port, seconds=opts.seconds, max_bytes=opts.max_bytes, timeout=f"{left:.1f}")
        server = asyncio.ensure_future(
            _run(runner, t.b, agent_argv(opts.python, "serve", bind=t.b_ip, **common), token))
        client = asyncio.ensure_future(
            _run(runner, t.a, agent_argv(opts.python, "send", bind=t.a_ip, to=t.b_ip, pings=opts.pings, **common), token))
        ends = ((server, t.b, "serve", t.b_ip), (client, t.a, "send", t.a_ip))
        done, _ = await asyncio.wait({server, client}, timeout=left + GRACE, return_when=asyncio.FIRST_COMPLETED)
        if server in done and server.result().rc == 3:  # port taken on b: draw another
            await _cancel(client)
            continue
        for task, host, role, addr in ends:
            if task in done and not task.result().ok:
                await _cancel(server, client)
                return CableResult(t, error=_why(host, role, addr, task.result(), opts.python))
        if done and len(done) < 2:  # one end is through: the other follows at once
            done, _ = await asyncio.wait({server, client}, timeout=max(end - time.monotonic(), 1.0))
        if len(done) < 2:
            await _cancel(server, client)
            waiting = " and ".join(h for task, h, _, _ in ends if task not in done)
            return CableResult(t, error=f"no answer from {waiting} within {left + GRACE:.0f} s")
        for task, host, role, addr in ends:
            if not task.result().ok:
                return CableResult(t, error=_why(host, role, addr, task.result(), opts.python))
        try:
            return judge(t, parse_transfer(client.result().stdout), opts.thresholds)
        except AgentOutputError as exc:
            return CableResult(t, error=f"{t.a} (send on {t.a_ip}): {exc}")
    return CableResult(t, error=f"{t.b}: no free port found for the receiver after {PORT_TRIES} tries")


async def check(runner: Runner, cables: Sequence[Target], opts: CheckOptions | None = None,
                progress: CableCheckProgress | None = None) -> Report:
    """Measure every cable, one round of host-disjoint cables at a time, within `opts.budget` seconds."""
    opts = opts or CheckOptions()
    start = time.monotonic()
    deadline = start + opts.budget
    results: dict[int, CableResult] = {}
    total = len(cables)

    async def one(t: Target) -> None:
        results[t.id] = await measure_cable(runner, t, opts, deadline)
        if progress is not None:
            progress.cable_done(results[t.id], len(results), total)

    for rnd in schedule(cables):
        await asyncio.gather(*(one(t) for t in rnd))
    return Report([results[t.id] for t in cables], opts.thresholds, time.monotonic() - start)


# -- the command line (`mlx-jupyter config --measure`) -------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The `--measure` flags of `mlx-jupyter config`."""
    d = CheckOptions()
    g = p.add_argument_group("cable check (--measure)")
    g.add_argument("--measure", action="store_true",
                   help="after setup, measure Gb/s each way and the round trip over every cable of the plan")
    from mlx_jupyter.vocab.limits import MAX_SSH_SECONDS, arg_type, seconds

    g.add_argument("--measure-seconds", type=arg_type(seconds, "--measure-seconds", high=MAX_SSH_SECONDS, example="2"),
                   default=d.seconds, metavar="S",
                   help=f"how long each direction sends (default {d.seconds:g})")
    g.add_argument("--measure-threshold", type=float, default=SLOW_FRACTION, metavar="F",
                   help=f"flag a cable under this fraction of its nominal speed (default {SLOW_FRACTION:g})")
    g.add_argument("--measure-asymmetry", type=float, default=ASYMMETRY_FACTOR, metavar="X",
                   help=f"flag a cable whose directions differ by more than this factor (default {ASYMMETRY_FACTOR:g})")
    g.add_argument("--measure-timeout", type=arg_type(seconds, "--measure-timeout", high=MAX_SSH_SECONDS, example="30"),
                   default=d.cable_timeout, metavar="S",
                   help=f"give up on one cable after this long (default {d.cable_timeout:g})")
    g.add_argument("--measure-budget", type=arg_type(seconds, "--measure-budget", example="300"),
                   default=d.budget, metavar="S",
                   help=f"give up on the whole check after this long (default {d.budget:g})")
    g.add_argument("--measure-python", default=d.python, metavar="P",
                   help=f"the Python 3 to run on the hosts (default {d.python})")


def options_from_args(args: argparse.Namespace) -> CheckOptions | None:
    """The options the `--measure-*` flags ask for (None without --measure); raises ValueError naming the bad flag."""
    if not args.measure:
        return None
    if args.over != "thunderbolt" or args.dot:
        raise ValueError("--measure checks the Thunderbolt cables of the plan; it does not go with "
                         f"{'--dot' if args.dot else '--over ethernet'}")
    for flag in ("seconds", "timeout", "budget"):
        if not getattr(args, f"measure_{flag}") > 0:
            raise ValueError(f"--measure-{flag} must be positive")
    try:
        th = Thresholds(args.measure_threshold, args.measure_asymmetry)
    except ValueError as exc:
        raise ValueError(f"--measure-threshold/--measure-asymmetry: {exc}") from None
    return CheckOptions(seconds=args.measure_seconds, cable_timeout=args.measure_timeout, budget=args.measure_budget,
                        python=args.measure_python, thresholds=th)


async def measure_topology(topo: Any, runner: Runner, opts: CheckOptions, out: TextIO, err: TextIO,
                           verbose: bool = False) -> Report:
    """Check every cable of `topo`'s plan, report on `out`, progress on `err`."""
    from mlx_jupyter.topology.cablecheck import targets

    cables = targets(topo)
    if not cables:
        err.write("measure: the plan has no cable between listed hosts; nothing to check\n")
        return Report([], opts.thresholds)
    rounds = len(schedule(cables))
    err.write(f"measuring {len(cables)} cable{'s' if len(cables) != 1 else ''} in {rounds} "
              f"round{'s' if rounds != 1 else ''} ({opts.seconds:g} s each way, at most {opts.budget:g} s in all)\n")
    report = await check(runner, cables, opts, TextProgress(err, verbose))
    title = "Cable check"
    out.write(f"{title}\n{'=' * len(title)}\n{report.text()}")
    return report
