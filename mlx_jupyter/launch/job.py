"""The launch itself, on an asyncio loop: plan, connect, spawn, watch, fail fast, tear down.

Everything waits on events (process exits, pipe data, ssh keepalives); nothing
polls, so the launcher is idle while the ranks are. A :class:`Job` is composed of
:class:`~mlx_jupyter.launch.connections.HostConnections` (ssh and the watchdogs),
:class:`~mlx_jupyter.launch.monitor.RankMonitor` (output, exits, failures) and
:class:`~mlx_jupyter.launch.stop.Teardown` (signals, stop, cleanup).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import sys
from typing import TYPE_CHECKING, Optional, Sequence

from mlx_jupyter.vocab.backends import get
from mlx_jupyter.hostfile import (BACKENDS, Host, HostfileError, default_ranks_per_host, hostfile_path, merge_settings,
                                  read_hostfile, resolve_hosts)
from mlx_jupyter.launch import contract, mpi, mpi_exits, where_ask
from mlx_jupyter.vocab import binding
from mlx_jupyter.launch.addresses import fill_addresses
from mlx_jupyter.launch.connections import HostConnections
from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.vocab.ports import DEFAULT_STARTING_PORT
from mlx_jupyter.launch.launch_config import ExitCallback, LaunchConfig, OutputCallback, rank_argv
from mlx_jupyter.launch.launch_job import LaunchJob
from mlx_jupyter.launch import remote_check
from mlx_jupyter.launch.local import LocalProcess, refuse_unavailable
from mlx_jupyter.launch.monitor import RankMonitor, RankProcess
from mlx_jupyter.vocab.rankinfo import RUNNING, RankInfo
from mlx_jupyter.launch.remote import RemoteProcess
from mlx_jupyter.launch.script import rank_script
from mlx_jupyter.launch.stop import Teardown
from mlx_jupyter.launch.streams import LineSplitter
from mlx_jupyter.launch.terminal import TERMINAL
from mlx_jupyter.net import ssh

if TYPE_CHECKING:
    from mlx_jupyter.where.model import Where

__all__ = ["ExitCallback", "Job", "LaunchConfig", "LaunchJob", "OutputCallback", "make_job", "rank_argv"]


def make_job(config: LaunchConfig) -> LaunchJob:
    """The launch for ``config``: a :class:`Job` (local, ssh, mpirun) or, with ``config.slurm``, a Slurm step."""
    if config.slurm is not None:
        from mlx_jupyter.launch.slurm.job import SlurmJob

        if config.hosts is not None and config.hosts != "127.0.0.1":
            raise LaunchError("with Slurm the hosts are the allocation's nodes: give no hosts (--hosts/--hostfile)")
        return SlurmJob(config)
    return Job(config)


class Job:
    """One launch. Create, ``await start()``, then ``await wait()``; ``stop()`` tears it down."""

    def __init__(self, config: LaunchConfig):
        self.config = config
        self.token = secrets.token_hex(16)
        self.backend = self._apply_hostfile()
        if self.backend not in BACKENDS:
            raise LaunchError(f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        try:
            repeat = config.repeat_hosts or default_ranks_per_host(config.hosts is not None)
            self.hosts: list[Host] = resolve_hosts(config.hosts, repeat)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        self.connections = HostConnections(self.hosts, config.ssh_options, config.start_timeout, self.log)
        self.monitor = RankMonitor(config, [RankInfo(r, h.ssh) for r, h in enumerate(self.hosts)], len(self.hosts),
                                   on_failure=self._fail_fast, local=[h.is_local for h in self.hosts])
        self.teardown = Teardown(self.monitor, self.connections, config.grace, self.log)
        self._cpu_shares: dict[int, frozenset[int]] = {}   # local rank -> the CPUs it is bound to

    def _apply_hostfile(self) -> str:
        """A hostfile path given as ``hosts`` brings its backend and envs (explicit ones win, with a notice);
        the backend, with neither the default."""
        c = self.config
        path = hostfile_path(c.hosts)
        try:
            hf = read_hostfile(path) if path is not None else None
        except HostfileError as exc:
            raise LaunchError(str(exc)) from None
        settings = merge_settings(hf, f"hostfile {path}", c.backend, c.env, env_source="env=")
        c.backend, c.env = settings.backend, settings.env
        for notice in settings.notices:
            print(f"mlx-jupyter launch: {notice}", file=sys.stderr)
        return settings.backend

    def log(self, msg: str) -> None:
        """A step, on stderr with ``verbose``."""
        if self.config.verbose:
            TERMINAL.say(f"mlx-jupyter launch: {msg}")

    @property
    def ranks(self) -> list[RankInfo]:
        """Per-rank info: rank, host, pid (on its host), state, returncode (with mpi: mpirun's)."""
        return self.monitor.ranks

    @property
    def failures(self) -> list[int]:
        """The ranks that failed, in the order they did."""
        return self.monitor.failures

    async def start(self) -> None:
        """Spawn every rank; return once all have started, or tear down and raise."""
        self.monitor.begin()
        try:
            if get(self.backend).mpirun:
                await self._start_mpi()
            else:
                await self._start_ranks()
        except BaseException:
            await self.stop(self.config.grace)
            raise
        self.monitor.all_watched()

    def _fail_fast(self) -> None:
        """A rank failed (``terminate_on_failure``): stop the others."""
        asyncio.ensure_future(self.teardown.stop(self.config.grace))

    async def signal(self, sig: int, ranks: Optional[Sequence[int]] = None) -> None:
        """Send ``sig`` to the process groups of ``ranks`` (default: all running ranks)."""
        await self.teardown.signal(sig, ranks)

    async def where(self, timeout: float = 2.0) -> Where:
        """Where every rank is: SIGUSR1 to the running ranks (started with ``where_on_signal``), their
        answers within ``timeout`` s, as a :class:`mlx_jupyter.where.model.Where`. With mpi the signal
        goes to mpirun, which passes it on to every rank."""
        m = self.monitor
        if m.mpi_plan is not None:
            ranks = list(range(m.mpi_plan.size))
            running = ranks if m.ranks[0].state == RUNNING else []
            ended = {} if running else {r: where_ask.ended_words(m.ranks[0]) for r in ranks}
            targets: Optional[list[int]] = [0]
        else:
            ranks = [i.rank for i in m.ranks]
            running = targets = [i.rank for i in m.ranks if i.state == RUNNING]
            ended = {i.rank: where_ask.ended_words(i) for i in m.ranks if i.state != RUNNING}
        asked = running if self.config.where_on_signal else []
        samples = await m.where.ask(asked, lambda: self.signal(signal.SIGUSR1, targets), timeout)
        return where_ask.table(samples, ended, ranks, bool(asked) and m.where.booted)

    async def stop(self, timeout: float = 2.0) -> None:
        """SIGTERM every running rank, SIGKILL after ``grace``, wait up to ``timeout``, clean up."""
        await self.teardown.stop(timeout)

    async def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for every rank; 0 if all exited 0, else the first failing rank's code."""
        await self.monitor.wait(timeout)
        await self.teardown.cleanup()
        return self.monitor.exit_code()

    def exit_code(self) -> int:
        """0, or the code of the first rank that failed (255 for a lost host)."""
        return self.monitor.exit_code()

    def summary(self) -> str:
        """One line naming each failed, lost or killed rank with its host and code."""
        return self.monitor.summary()

    def _plans(self) -> list[contract.RankPlan]:
        c = self.config
        try:
            return contract.plan_ranks(
                self.backend, self.hosts, env=dict(c.env), token=self.token,
                starting_port=c.starting_port or DEFAULT_STARTING_PORT,
                connections_per_ip=c.connections_per_ip, nccl_port=c.nccl_port, verbose=c.verbose,
                coordinator=c.jaccl_coordinator,
            )
        except ValueError as exc:
            raise LaunchError(str(exc)) from None

    async def _start_ranks(self) -> None:
        c = self.config
        for note in await fill_addresses(self.backend, self.hosts, c.ssh_options):
            print(f"mlx-jupyter launch: {note}", file=sys.stderr)
        plans = self._plans()
        if any(p.host.is_local for p in plans):
            refuse_unavailable(self.backend)   # ranks on this machine; remote hosts answer on their watchdog's session
        argv = self.monitor.argv = rank_argv(c.command, c.python, c.cwd)
        argv = self.monitor.where.boot(argv, c.where_on_signal)
        if any(h.is_local for h in self.hosts):
            await self.connections.start_local_watchdog()
        await self.connections.connect(remote_check.probe_script(self.backend, argv))
        await remote_check.refuse_unavailable(self.connections.answers, self.backend)   # before any rank starts
        for p in plans:
            extra = dict(c.rank_env(p.rank)) if c.rank_env else {}
            p.env.update(extra)
            p.env.setdefault("PYTHONUNBUFFERED", "1")   # rank output arrives as it is printed
        self.log(f"starting {len(plans)} rank(s): {ssh.join(argv)}")
        local = [p.rank for p in plans if p.host.is_local]
        shares = binding.plan(c.bind_to, len(local)) or []
        self._cpu_shares = dict(zip(local, shares))
        spawned = await asyncio.gather(*(self._spawn(p, argv) for p in plans), return_exceptions=True)
        for r, res in enumerate(spawned):
            if not isinstance(res, BaseException):
                self.monitor.watch(r, res)
        errors = [(r, e) for r, e in enumerate(spawned) if isinstance(e, BaseException)]
        if errors:
            msgs = [str(e) if isinstance(e, LaunchError) else f"rank {r}: {type(e).__name__}: {e}" for r, e in errors]
            raise LaunchError("\n".join(msgs))

    async def _spawn(self, plan: contract.RankPlan, argv: list[str]) -> RankProcess:
        c = self.config
        rank, host = plan.rank, plan.host
        label = f"rank {rank} on {host.ssh}"
        emit = self.monitor.emit
        out = LineSplitter(lambda text, ends: emit(rank, "stdout", text, ends))
        err = LineSplitter(lambda text, ends: emit(rank, "stderr", text, ends))
        if host.is_local:
            env = {**os.environ, **plan.env}
            for name, content in plan.files.items():
                env[name] = self.connections.write_local_file(f"rank{rank}-{name}", content)
            cwd = c.cwd if c.cwd is not None else None
            if c.cwd is not None and not os.path.isdir(c.cwd):
                raise LaunchError(f"{label}: working directory {c.cwd!r} does not exist (--cwd)")
            share = self._cpu_shares.get(rank)
            local = await LocalProcess.spawn(argv, env, cwd, c.stdin, out, err, label,
                                             self.connections.local_watchdog, cpus=share,
                                             hold_usr1=self.monitor.where.booted)
            if local.bound and share is not None:
                self.log(f"{label}: bound to {binding.describe(share)} (--bind-to none: unbound)")
            proc: RankProcess = local
        else:
            cwd = c.cwd if c.cwd is not None else os.getcwd()
            conn = self.connections.rank_conn[rank]
            try:
                start = rank_script(argv, plan.env, plan.files, cwd, c.cwd is not None, label,
                                    self.connections.watchdogs[conn].path, hold_usr1=self.monitor.where.booted)
            except ValueError as exc:
                raise LaunchError(f"{label}: {exc}") from None
            proc = await RemoteProcess.spawn(conn, start.script, c.stdin, out, err, label, c.start_timeout,
                                             start.setup)
        info = self.ranks[rank]
        info.pid, info.state = proc.pid, RUNNING
        return proc

    async def _start_mpi(self) -> None:
        c = self.config
        argv = self.monitor.argv = rank_argv(c.command, c.python, c.cwd)
        argv = self.monitor.where.boot(argv, c.where_on_signal)
        watchdog = await self.connections.start_local_watchdog()
        env = {**dict(c.env)}
        if c.rank_env:
            env.update(c.rank_env(0))
        # no PYTHONUNBUFFERED here: ranks share mpirun's output, and unbuffered
        # writes of line fragments would interleave between ranks
        marker = mpi_exits.new_marker()
        try:
            cmd, plan, version = mpi.mpirun_command(self.hosts, argv, env, self.token, c.cwd, c.mpi_args,
                                                    self.connections.write_local_file, marker)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        self.log(f"running {ssh.join(cmd)}")
        # mpirun starts every rank itself: the launcher sees one process (shown as rank 0);
        # Open MPI tags each output line with its rank, which goes to on_output.
        m = self.monitor
        m.ranks = [RankInfo(0, "mpirun")]
        m.mpi_plan = plan
        if version is not None:
            m.mpi_output = tagged = mpi.TaggedOutput(m.emit, version, marker)
            out = LineSplitter(lambda text, ends: tagged.piece("stdout", text, ends))
            err = LineSplitter(lambda text, ends: tagged.piece("stderr", text, ends))
        else:
            out = LineSplitter(lambda text, ends: m.emit(0, "stdout", text, ends))
            err = LineSplitter(lambda text, ends: m.emit(0, "stderr", text, ends))
        env = mpi.outside_enclosing_job({**os.environ, **plan.env})
        proc = await LocalProcess.spawn(cmd, env, c.cwd, c.stdin, out, err, "mpirun",
                                        watchdog, watchdog_session=True)
        m.ranks[0].pid, m.ranks[0].state = proc.pid, RUNNING
        m.watch(0, proc)

    @property
    def size(self) -> int:
        """Number of ranks (with mpi, those mpirun starts)."""
        return len(self.hosts)

    def write_stdin(self, data: bytes, rank: Optional[int] = None) -> None:
        """Write ``data`` to ``rank``'s stdin, or to every rank's (None)."""
        for r, p in self.monitor.procs.items():
            if rank is None or r == rank:
                p.write(data)

    def close_stdin(self, others_than: Optional[int] = None) -> None:
        """Send EOF to every rank's stdin (but ``others_than``'s, if given)."""
        for r, p in self.monitor.procs.items():
            if r != others_than:
                p.close_stdin()
