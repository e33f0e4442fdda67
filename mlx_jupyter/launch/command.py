"""``mlx-jupyter launch [options] [--] command args...``: run a command on every rank.

Options end where the command begins: in ``launch -n 2 python t.py --verbose``
the ``--verbose`` belongs to ``t.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import stat
import sys
from functools import partial
from typing import Optional, Sequence

from mlx_jupyter.vocab import limits, options
from mlx_jupyter.net import ssh
from mlx_jupyter.vocab.ports import CORE_PORT_OFFSET, DEFAULT_NCCL_PORT, DEFAULT_STARTING_PORT, free_port_block
from mlx_jupyter.vocab.backends import get
from mlx_jupyter.vocab.hosts import hostfile_overrides
from mlx_jupyter.hostfile import (Host, HostfileError, default_ranks_per_host, merge_settings, parse_env,
                                  parse_host_list, read_hostfile, repeat_hosts)
from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.launch.launch_config import local_script
from mlx_jupyter.launch.job import LaunchConfig, LaunchJob, make_job
from mlx_jupyter.launch.rank_output import LineHold
from mlx_jupyter.vocab.rankinfo import rank_prefix
from mlx_jupyter.launch.slurm import command as slurm_command
from mlx_jupyter.launch.terminal import TERMINAL
from mlx_jupyter.suggest import ArgumentParser

PROG = "mlx-jupyter launch"


class CommandLineError(Exception):
    """Bad command line: printed with the usage hint, exit status 2."""


EXAMPLES = f"""\
examples:
  {PROG} -n 2 -- python train.py
      two ranks on this machine; a bare python/python3 is this interpreter ({PROG} --print-python)
  {PROG} --hosts mac1,mac2 -- python train.py
      a rank per host over ssh; names resolve as ssh would (HostName, then DNS), the addresses are shown
  {PROG} --hostfile tb.json -- python train.py
      hosts, addresses, backend and env from a hostfile (mlx-jupyter config writes one)
  {PROG} -n 2 --env MLX_METAL_FAST_SYNCH=1 --backend ring -- python train.py --epochs 3
      options end where the command begins: --epochs is train.py's
"""


def build_parser() -> argparse.ArgumentParser:
    """The option parser (options only: the command is split off before parsing)."""
    p = ArgumentParser(
        prog=PROG, allow_abbrev=False,
        usage=f"{PROG} [options] [--] command [args...]",
        description="Run a command on every rank, locally, over ssh or under Slurm, with MLX's distributed environment.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # the options a cluster start has too: mlx_jupyter.vocab.options (the groups, ssh and Slurm, below)
    options.add_to_parser(p, options.LAUNCH, group="", python=sys.executable)   # None would mean the same
    p.add_argument("--mpi-arg", action="append", default=[], metavar="A", help="extra mpirun argument(s)")
    p.add_argument("--connections-per-ip", type=limits.arg_type(limits.count, "--connections-per-ip",
                                                                high=limits.MAX_CONNECTIONS_PER_IP),
                   default=1, metavar="N", help="ring: connections per IP")
    p.add_argument("-p", "--starting-port", type=limits.arg_type(limits.port, "-p"), metavar="P",
                   help=f"ring: first port, default {DEFAULT_STARTING_PORT}, or a free block when every rank runs "
                        f"here, or one derived from the job id under Slurm (our core also uses "
                        f"port-{CORE_PORT_OFFSET} from 31768 to 33767, else port+{CORE_PORT_OFFSET}); "
                        "jaccl: coordinator port")
    p.add_argument("--nccl-port", type=limits.arg_type(limits.port, "--nccl-port"), default=DEFAULT_NCCL_PORT,
                   metavar="P", help="nccl rendezvous port")
    p.add_argument("--no-verify-script", action="store_true", help="don't check locally that the command exists")
    p.add_argument("--print-python", action="store_true", help="print the interpreter path and exit")
    p.add_argument("--verbose", action="store_true", help="log steps to stderr")
    p.add_argument("--where-on-signal", action="store_true",
                   help="Python ranks answer SIGUSR1: `kill -USR1 <launcher pid>` prints the line and "
                        "collective each rank is in")
    p.add_argument("--stdin-rank", type=limits.arg_type(limits.count, "--stdin-rank", low=0, high=1 << 20,
                                                        what="a rank", example="0"), metavar="R",
                   help="send this terminal's stdin to rank R only (the others read EOF at once), e.g. to answer "
                        "rank R's breakpoint(); default: every rank gets a copy")
    p.add_argument("--output", choices=("prefix", "raw"), help="prefix lines with [rank r] (default with >1 rank)")
    ssh.add_arguments(p)
    slurm_command.add_arguments(p)
    return p


def _value_flags(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions if a.nargs != 0 for s in a.option_strings}


def split_argv(argv: Sequence[str], parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """Split into (launcher options, command): the command starts at the first non-option or after ``--``."""
    takes_value = _value_flags(parser)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return list(argv[:i]), list(argv[i + 1:])
        if not arg.startswith("-") or arg == "-":
            return list(argv[:i]), list(argv[i:])
        name = arg.split("=", 1)[0]
        if name in takes_value and "=" not in arg:
            i += 2
        elif not arg.startswith("--") and len(arg) > 2 and arg[:2] in takes_value:
            i += 1  # -n2 / -pPORT
        else:
            i += 1
    return list(argv), []


def verify_command(command: list[str], cwd: Optional[str]) -> None:
    """Check locally that the script/command exists; raise :class:`CommandLineError` otherwise."""
    first = command[0]
    base = cwd if cwd and os.path.isdir(cwd) else os.getcwd()
    if local_script(first, cwd) is not None:
        return
    if first.endswith(".py") or "/" in first:
        if not os.path.exists(os.path.join(base, first)):
            raise CommandLineError(f"{first!r} not found in {base}; pass --no-verify-script if it exists only on the hosts")
    elif shutil.which(first) is None:
        raise CommandLineError(f"command {first!r} not found on PATH; pass --no-verify-script if it exists only on the hosts")


def _starting_port(args: argparse.Namespace, hosts: Optional[list[Host]]) -> Optional[int]:
    """``-p``, else under Slurm None (derived from the job id), else a free block when every rank runs
    on this machine (two local launches at once do not collide), else MLX's default."""
    given: Optional[int] = args.starting_port
    if given is not None or hosts is None:
        return given
    if all(h.is_local for h in hosts):
        return free_port_block(len(hosts) * args.connections_per_ip)
    return DEFAULT_STARTING_PORT


def make_config(args: argparse.Namespace, command: list[str]) -> LaunchConfig:
    """Turn parsed options into a :class:`LaunchConfig` (warnings printed, errors raised)."""
    misused = slurm_command.misused(args)
    if misused:
        raise CommandLineError(f"{', '.join(misused)} only work(s) with --slurm")
    if args.slurm and (args.hosts or args.hostfile):
        raise CommandLineError("--slurm runs the ranks on the allocation's nodes: drop --hosts/--hostfile")
    hf = read_hostfile(args.hostfile) if args.hostfile else None
    n = args.repeat_hosts or default_ranks_per_host(bool(args.hosts or hf or args.slurm))
    if args.slurm:
        hosts = None
    elif hf:
        hosts = repeat_hosts(hf.hosts, n)
    else:
        hosts = parse_host_list(args.hosts or "127.0.0.1", n)
    explicit, warnings = parse_env(args.env, "--env", passthrough=os.environ)
    settings = merge_settings(hf, f"hostfile {args.hostfile}", args.backend, explicit)
    env = settings.env
    if args.hosts and hf:
        print(f"{PROG}: {hostfile_overrides(args.hosts)}", file=sys.stderr)
    for w in warnings:
        print(f"{PROG}: warning: {w}", file=sys.stderr)
    for notice in settings.notices:
        print(f"{PROG}: {notice}", file=sys.stderr)
    cols, lines = shutil.get_terminal_size((0, 0))
    if cols > 0 and sys.stdout.isatty():
        env.setdefault("COLUMNS", str(cols))
        env.setdefault("LINES", str(lines))
    opts = ssh.options_from_args(args)
    if args.stdin_rank is not None:
        size = len(hosts) if hosts is not None else None
        if args.slurm or get(settings.backend).mpirun:
            raise CommandLineError("--stdin-rank works with ranks this launcher starts itself "
                                   "(not with --slurm or --backend mpi, whose ranks one srun/mpirun feeds)")
        if args.stdin_rank < 0 or (size is not None and args.stdin_rank >= size):
            raise CommandLineError(f"--stdin-rank {args.stdin_rank}: the ranks are 0-{(size or 1) - 1}")
    return LaunchConfig(
        command=command, hosts=hosts, backend=settings.backend, env=env,
        cwd=args.cwd, cwd_required=args.cwd is not None, python=args.python, starting_port=_starting_port(args, hosts),
        connections_per_ip=args.connections_per_ip, nccl_port=args.nccl_port, ssh_options=opts, stdin=True,
        stdin_rank=args.stdin_rank, verbose=args.verbose, mpi_args=list(args.mpi_arg),
        where_on_signal=args.where_on_signal, bind_to=args.bind_to,
        slurm=slurm_command.options_from_args(args) if args.slurm else None,
    )


class _Output:
    """Writes rank text to our stdout/stderr as it comes (:class:`~.terminal.Terminal`), prefixed or raw
    (``mode`` None: prefixed with more than one rank)."""

    def __init__(self, mode: Optional[str], job: LaunchJob):
        self.mode, self.job = mode, job   # a Slurm job knows its size once it has its nodes
        self.held = LineHold(self._write)   # labelled lines that come in chunks stay whole

    def __call__(self, rank: int, stream: str, text: str, ends: bool) -> None:
        if self._prefixed():
            self.held(rank, stream, text, ends)
        else:
            self._write(rank, stream, text, ends)

    def _prefixed(self) -> bool:
        return self.mode == "prefix" or (self.mode is None and self.job.size > 1)

    def _write(self, rank: int, stream: str, text: str, ends: bool) -> None:
        size = self.job.size
        prefix = self._prefixed()
        # rank -1: mpirun's or srun's own messages, never prefixed
        TERMINAL.write(rank, stream, text, ends, rank_prefix(rank, size) if prefix else "", breaks=prefix,
                       whole=size > 1)


async def _pump_stdin(job: LaunchJob, rank: Optional[int] = None) -> None:
    """Send our stdin to every rank, or only to ``rank`` (the others get EOF now), until EOF
    (event-driven; files read in a thread)."""
    loop = asyncio.get_running_loop()
    if rank is not None:
        job.close_stdin(others_than=rank)
    write = partial(job.write_stdin, rank=rank)   # None: every rank (a Slurm job's srun takes one stream)
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, ValueError, OSError):
        job.close_stdin()
        return
    mode = os.fstat(fd).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or (stat.S_ISCHR(mode) and os.isatty(fd)):
        reader = asyncio.StreamReader()
        blocking = os.get_blocking(fd)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(os.dup(fd), "rb", 0))
        try:
            while data := await reader.read(1 << 16):
                write(data)
        finally:
            transport.close()
            os.set_blocking(fd, blocking)
    else:  # a regular file or /dev/null: reads never block for long
        while data := await loop.run_in_executor(None, os.read, fd, 1 << 16):
            write(data)
    job.close_stdin()


async def run(config: LaunchConfig, output: str | None) -> int:
    """Launch, forward stdin and signals, wait; return the exit status."""
    job = make_job(config)
    config.on_text = shown = _Output(output, job)
    loop = asyncio.get_running_loop()
    interrupts = 0
    started = False
    stopped_by: Optional[int] = None   # the signal that ended a launch still starting

    def on_sigint() -> None:
        nonlocal interrupts, stopped_by
        interrupts += 1
        if not started:   # e.g. waiting for a Slurm allocation: give up on it
            stopped_by = signal.SIGINT
            TERMINAL.say(f"\n{PROG}: interrupted while starting; cancelling")
            asyncio.ensure_future(job.stop(2.0))
        elif interrupts == 1:
            TERMINAL.say(f"\n{PROG}: forwarding Ctrl-C to every rank (press again to terminate them)")
            asyncio.ensure_future(job.signal(signal.SIGINT))
        else:
            asyncio.ensure_future(job.stop(2.0))

    def on_term(sig: int) -> None:
        nonlocal stopped_by
        if not started:
            stopped_by = sig
        asyncio.ensure_future(job.stop(2.0))

    async def print_where() -> None:
        if not started:
            TERMINAL.say(f"{PROG}: the ranks are still starting")
            return
        if not config.where_on_signal:
            TERMINAL.say(f"{PROG}: the ranks were started without --where-on-signal: they cannot say where they are")
        where = await job.where()
        TERMINAL.say(f"{PROG}: {where}")

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    loop.add_signal_handler(signal.SIGUSR1, lambda: asyncio.ensure_future(print_where()))
    for sig in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, on_term, sig)
    stdin_task: Optional[asyncio.Task[None]] = None
    try:
        try:
            await job.start()
        except LaunchError as exc:
            if stopped_by is None:
                raise
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 128 + stopped_by
        started = True
        stdin_task = asyncio.ensure_future(_pump_stdin(job, config.stdin_rank))
        code = await job.wait()
    finally:
        if stdin_task is not None:
            stdin_task.cancel()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            loop.remove_signal_handler(sig)
    shown.held.flush()
    TERMINAL.end_lines()   # a last unfinished line, so the summary and the shell's prompt start on their own
    summary = job.summary()
    if summary:
        print(f"{PROG}: {summary}", file=sys.stderr)
    if code < 0:
        return 128 - code
    return min(code, 255)


def _detach(args: argparse.Namespace, command: list[str], config: LaunchConfig) -> int:
    """Submit the launch as a Slurm batch job; print its id."""
    try:
        job_id = slurm_command.submit_detached(args, command, dict(config.env))
    except (LaunchError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    print(job_id)
    print(f"{PROG}: submitted Slurm job {job_id}; its output goes to slurm-{job_id}.out "
          f"(squeue --jobs={job_id}; scancel {job_id})", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    """Entry point for ``mlx-jupyter launch``; returns the exit status."""
    parser = build_parser()
    opts, command = split_argv(argv, parser)
    args = parser.parse_args(opts)
    if args.print_python:
        print(args.python)
        return 0
    try:
        if not command:
            raise CommandLineError("no command given; e.g. `mlx-jupyter launch -n 2 -- python script.py`")
        if not args.no_verify_script:
            verify_command(command, args.cwd)
        config = make_config(args, command)
    except (CommandLineError, HostfileError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if args.detach:
        return _detach(args, command, config)
    try:
        return asyncio.run(run(config, args.output))
    except LaunchError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
