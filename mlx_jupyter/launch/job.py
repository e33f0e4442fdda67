"""The launch itself, on an asyncio loop: plan, connect, spawn, watch, fail fast, tear down.

Everything waits on events (process exits, pipe data, ssh keepalives); nothing
polls, so the launcher is idle while the ranks are.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
from typing import Any, Optional

from mlx_jupyter.launch import contract
from mlx_jupyter.net import ssh
from mlx_jupyter.hostfile import BACKENDS, Host, HostfileError, hostfile_path, merge_settings, read_hostfile, resolve_hosts
from mlx_jupyter.launch import mpi
from mlx_jupyter.launch.config import DEFAULT_STARTING_PORT, ExitCallback, LaunchConfig, OutputCallback, rank_argv
from mlx_jupyter.launch.connections import Connections
from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.launch.guard import LocalWatchdog
from mlx_jupyter.launch.local import LocalProcess
from mlx_jupyter.launch.streams import LineSplitter
from mlx_jupyter.launch.rankinfo import RUNNING, RankInfo
from mlx_jupyter.launch.remote import RemoteProcess, Watchdog
from mlx_jupyter.launch.script import rank_script
from mlx_jupyter.launch.stop import Stop
from mlx_jupyter.launch.watch import Watch

__all__ = ["ExitCallback", "Job", "LaunchConfig", "OutputCallback", "make_job", "rank_argv"]


def make_job(config: LaunchConfig) -> Any:
    """The launch for ``config``: a :class:`Job` (local, ssh, mpirun) or, with ``config.slurm``, a Slurm step."""
    if config.slurm is not None:
        from mlx_jupyter.launch.slurm.job import SlurmJob

        if config.hosts is not None and config.hosts != "127.0.0.1":
            raise LaunchError("with Slurm the hosts are the allocation's nodes: give no hosts (--hosts/--hostfile)")
        return SlurmJob(config)
    return Job(config)


class Job(Connections, Watch, Stop):
    """One launch. Create, ``await start()``, then ``await wait()``; ``stop()`` tears it down."""

    def __init__(self, config: LaunchConfig):
        self.config = config
        self.token = secrets.token_hex(16)
        self._apply_hostfile()
        if config.backend not in BACKENDS:
            raise LaunchError(f"backend {config.backend!r} is not one of {', '.join(BACKENDS)}")
        try:
            self.hosts: list[Host] = resolve_hosts(config.hosts, config.repeat_hosts)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        self.ranks: list[RankInfo] = [RankInfo(r, h.ssh) for r, h in enumerate(self.hosts)]
        self.failures: list[int] = []          # ranks in the order they failed
        self._procs: dict[int, Any] = {}       # rank -> LocalProcess | RemoteProcess
        self._conns: dict[str, list[Any]] = {}   # host -> connections (more than one past MaxSessions)
        self._rank_conn: dict[int, Any] = {}
        self._watchdogs: dict[Any, Watchdog] = {}   # connection -> its watchdog session
        self._tmpdir: Optional[str] = None
        self._guard: Optional[LocalWatchdog] = None   # the local ranks' watchdog; owns _tmpdir
        self._done: Optional[asyncio.Event] = None
        self._watchers: list[asyncio.Task] = []
        self._stopping = False
        self._reaped = 0
        self._mpi_plan: Optional[contract.MPIPlan] = None
        self._mpi_output: Optional[mpi.TaggedOutput] = None

    def _apply_hostfile(self) -> None:
        """A hostfile path given as ``hosts`` brings its backend and envs (explicit ones win, with a notice)."""
        c = self.config
        path = hostfile_path(c.hosts)
        try:
            hf = read_hostfile(path) if path is not None else None
        except HostfileError as exc:
            raise LaunchError(str(exc)) from None
        settings = merge_settings(hf, f"hostfile {path}", c.backend, c.env)
        c.backend, c.env = settings.backend, settings.env
        for notice in settings.notices:
            print(f"mlx-jupyter launch: {notice}", file=sys.stderr)

    def log(self, msg: str) -> None:
        """A step, on stderr with ``verbose``."""
        if self.config.verbose:
            print(f"mlx-jupyter launch: {msg}", file=sys.stderr)

    async def start(self) -> None:
        """Spawn every rank; return once all have started, or tear down and raise."""
        self._done = asyncio.Event()
        try:
            if self.config.backend == "mpi":
                await self._start_mpi()
            else:
                await self._start_ranks()
        except BaseException:
            await self.stop(self.config.grace)
            raise
        if self._reaped == len(self._procs):
            self._done.set()

    def _plans(self) -> list[contract.RankPlan]:
        c = self.config
        try:
            return contract.plan_ranks(
                c.backend, self.hosts, env=dict(c.env), token=self.token,
                starting_port=c.starting_port or DEFAULT_STARTING_PORT,
                connections_per_ip=c.connections_per_ip, nccl_port=c.nccl_port, verbose=c.verbose,
            )
        except ValueError as exc:
            raise LaunchError(str(exc)) from None

    async def _start_ranks(self) -> None:
        c = self.config
        plans = self._plans()
        argv = rank_argv(c.command, c.python, c.cwd)
        if any(h.is_local for h in self.hosts):
            await self._start_guard()
        await self._connect()
        for p in plans:
            extra = dict(c.rank_env(p.rank)) if c.rank_env else {}
            p.env.update(extra)
            p.env.setdefault("PYTHONUNBUFFERED", "1")   # rank output arrives as it is printed
        self.log(f"starting {len(plans)} rank(s): {ssh.join(argv)}")
        spawned = await asyncio.gather(*(self._spawn(p, argv) for p in plans), return_exceptions=True)
        for r, res in enumerate(spawned):
            if not isinstance(res, BaseException):
                self._procs[r] = res
        for r, proc in self._procs.items():
            self._watchers.append(asyncio.ensure_future(self._watch(r, proc)))
        errors = [(r, e) for r, e in enumerate(spawned) if isinstance(e, BaseException)]
        if errors:
            msgs = [str(e) if isinstance(e, LaunchError) else f"rank {r}: {type(e).__name__}: {e}" for r, e in errors]
            raise LaunchError("\n".join(msgs))

    async def _spawn(self, plan: contract.RankPlan, argv: list[str]) -> Any:
        c = self.config
        rank, host = plan.rank, plan.host
        label = f"rank {rank} on {host.ssh}"
        out = LineSplitter(lambda line, r=rank: self._emit(r, "stdout", line))
        err = LineSplitter(lambda line, r=rank: self._emit(r, "stderr", line))
        if host.is_local:
            env = {**os.environ, **plan.env}
            for name, content in plan.files.items():
                env[name] = self._write_local_file(f"rank{rank}-{name}", content)
            cwd = c.cwd if c.cwd is not None else None
            if c.cwd is not None and not os.path.isdir(c.cwd):
                raise LaunchError(f"{label}: working directory {c.cwd!r} does not exist (--cwd)")
            proc: Any = await LocalProcess.spawn(argv, env, cwd, c.stdin, out, err, label, self._guard)
        else:
            cwd = c.cwd if c.cwd is not None else os.getcwd()
            conn = self._rank_conn[rank]
            try:
                script = rank_script(argv, plan.env, plan.files, cwd, c.cwd is not None, label,
                                     self._watchdogs[conn].path)
            except ValueError as exc:
                raise LaunchError(f"{label}: {exc}") from None
            proc = await RemoteProcess.spawn(conn, script, c.stdin, out, err, label, c.start_timeout)
        info = self.ranks[rank]
        info.pid, info.state = proc.pid, RUNNING
        return proc

    async def _start_mpi(self) -> None:
        c = self.config
        argv = rank_argv(c.command, c.python, c.cwd)
        await self._start_guard()
        env = {**dict(c.env)}
        if c.rank_env:
            env.update(c.rank_env(0))
        # no PYTHONUNBUFFERED here: ranks share mpirun's output, and unbuffered
        # writes of line fragments would interleave between ranks
        try:
            cmd, plan, version = mpi.mpirun_command(self.hosts, argv, env, self.token, c.cwd, c.mpi_args,
                                                    self._write_local_file)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        self.log(f"running {ssh.join(cmd)}")
        # mpirun starts every rank itself: the launcher sees one process (shown as rank 0);
        # Open MPI tags each output line with its rank, which goes to on_output.
        self.ranks = [RankInfo(0, "mpirun")]
        self._mpi_plan = plan
        if version is not None:
            self._mpi_output = mpi.TaggedOutput(self._emit, version)
            tagged = self._mpi_output
            out = LineSplitter(lambda line: tagged.line("stdout", line))
            err = LineSplitter(lambda line: tagged.line("stderr", line))
        else:
            out = LineSplitter(lambda line: self._emit(0, "stdout", line))
            err = LineSplitter(lambda line: self._emit(0, "stderr", line))
        proc = await LocalProcess.spawn(cmd, {**os.environ, **plan.env}, c.cwd, c.stdin, out, err, "mpirun",
                                        self._guard, guard_session=True)
        self.ranks[0].pid, self.ranks[0].state = proc.pid, RUNNING
        self._procs = {0: proc}
        self._watchers.append(asyncio.ensure_future(self._watch(0, proc)))

    @property
    def size(self) -> int:
        """Number of ranks (with mpi, those mpirun starts)."""
        return len(self.hosts)

    def write_stdin(self, data: bytes) -> None:
        """Broadcast ``data`` to every rank's stdin."""
        for p in self._procs.values():
            p.write(data)

    def close_stdin(self) -> None:
        """Send EOF to every rank's stdin."""
        for p in self._procs.values():
            p.close_stdin()
