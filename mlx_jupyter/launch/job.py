"""The launch itself, on an asyncio loop: plan, connect, spawn, watch, fail fast, tear down.

Everything waits on events (process exits, pipe data, ssh keepalives); nothing
polls, so the launcher is idle while the ranks are.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal as _signal
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from mlx_jupyter.launch import contract
from mlx_jupyter.net import ssh
from mlx_jupyter.hostfile import BACKENDS, Host, resolve_hosts
from mlx_jupyter.launch import mpi
from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.launch.guard import LocalWatchdog
from mlx_jupyter.launch.local import LocalProcess
from mlx_jupyter.launch.streams import LineSplitter
from mlx_jupyter.launch.rankinfo import EXITED, KILLED, LOST, RUNNING, RankInfo
from mlx_jupyter.launch.remote import RemoteProcess, Watchdog
from mlx_jupyter.launch.script import rank_script

OutputCallback = Callable[[int, str, str], None]
ExitCallback = Callable[[int, int], None]


@dataclass
class LaunchConfig:
    """Everything a launch needs (the :class:`~mlx_jupyter.launch.Launcher` arguments)."""

    command: list[str]
    hosts: Union[str, Path, Sequence[Host], None] = None
    repeat_hosts: int = 1
    backend: str = "ring"
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Optional[str] = None
    cwd_required: bool = False
    python: str = sys.executable
    starting_port: int = 32323
    connections_per_ip: int = 1
    nccl_port: int = 12345
    rank_env: Optional[Callable[[int], Mapping[str, str]]] = None
    on_output: Optional[OutputCallback] = None
    on_exit: Optional[ExitCallback] = None
    ssh_options: Optional[ssh.SSHOptions] = None
    stdin: bool = False
    terminate_on_failure: bool = True
    grace: float = 1.0                # SIGTERM -> SIGKILL when tearing down after a failure
    start_timeout: float = 30.0
    verbose: bool = False
    mpi_args: list[str] = field(default_factory=list)


def rank_argv(command: Sequence[str], python: str) -> list[str]:
    """The argv a rank runs: a ``.py`` script runs with ``python``."""
    if not command:
        raise LaunchError("no command given: what should every rank run?")
    argv = [str(a) for a in command]
    return [python, *argv] if argv[0].endswith(".py") else argv


class Job:
    """One launch. Create, ``await start()``, then ``await wait()``; ``stop()`` tears it down."""

    def __init__(self, config: LaunchConfig):
        self.config = config
        self.token = secrets.token_hex(16)
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

    def log(self, msg: str) -> None:
        """A step, on stderr with ``verbose``."""
        if self.config.verbose:
            print(f"mlx-jupyter launch: {msg}", file=sys.stderr)

    # ---------------------------------------------------------------- start --
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
                c.backend, self.hosts, env=dict(c.env), token=self.token, starting_port=c.starting_port,
                connections_per_ip=c.connections_per_ip, nccl_port=c.nccl_port, verbose=c.verbose,
            )
        except ValueError as exc:
            raise LaunchError(str(exc)) from None

    async def _start_ranks(self) -> None:
        c = self.config
        plans = self._plans()
        argv = rank_argv(c.command, c.python)
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

    async def _connect(self) -> None:
        """One connection per remote host, in parallel (more only where ranks exceed sshd's MaxSessions), each with its watchdog."""
        opts = self.config.ssh_options or ssh.SSHOptions()
        by_host: dict[str, list[int]] = {}
        for r, h in enumerate(self.hosts):
            if not h.is_local:
                by_host.setdefault(h.ssh, []).append(r)
        if not by_host:
            return
        self.log(f"connecting to {', '.join(by_host)}")
        per_conn = max(opts.max_sessions - 1, 1)   # one session is the watchdog
        try:
            first = await ssh.connect_all(list(by_host), opts)
            self._conns = {h: [c] for h, c in first.items()}
            extra = [h for h, ranks in by_host.items() for _ in range((len(ranks) - 1) // per_conn)]
            for h, conn in zip(extra, await asyncio.gather(*(ssh.connect(h, opts) for h in extra))):
                self._conns[h].append(conn)
        except ssh.SSHError as exc:
            raise LaunchError(str(exc)) from None
        for h, ranks in by_host.items():
            for k, r in enumerate(ranks):
                self._rank_conn[r] = self._conns[h][k // per_conn]
        conns = [(h, conn) for h, cs in self._conns.items() for conn in cs]
        dogs = await asyncio.gather(*(Watchdog.start(conn, f"ssh to {h}", self.config.start_timeout)
                                      for h, conn in conns), return_exceptions=True)
        for (_, conn), dog in zip(conns, dogs):
            if isinstance(dog, Watchdog):
                self._watchdogs[conn] = dog
        for dog in dogs:
            if isinstance(dog, BaseException):
                raise dog

    async def _start_guard(self) -> None:
        """The local ranks' watchdog, and with it this launch's local temp dir."""
        if self._guard is None:
            try:
                self._guard = await LocalWatchdog.start()
            except OSError as exc:
                raise LaunchError(f"cannot start the local ranks' watchdog (/bin/sh): {exc}") from None
            self._tmpdir = self._guard.path

    def _write_local_file(self, name: str, content: str) -> str:
        if self._tmpdir is None:
            self._tmpdir = tempfile.mkdtemp(prefix="mlx-jupyter-")
        path = os.path.join(self._tmpdir, name)
        with open(path, "w") as f:
            f.write(content)
        return path

    async def _start_mpi(self) -> None:
        c = self.config
        argv = rank_argv(c.command, c.python)
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

    # ---------------------------------------------------------------- watch --
    def _emit(self, rank: int, stream: str, line: str) -> None:
        cb = self.config.on_output
        if cb is None:
            target = sys.stdout if stream == "stdout" else sys.stderr
            prefix = f"[rank {rank}] " if self.size > 1 and rank >= 0 else ""
            print(prefix + line, file=target, flush=True)
            return
        try:
            cb(rank, stream, line)
        except Exception as exc:  # noqa: BLE001 - a user callback must not kill the launcher
            print(f"mlx-jupyter launch: on_output callback failed: {exc!r}", file=sys.stderr)

    async def _watch(self, rank: int, proc: Any) -> None:
        code = await proc.wait()
        if self._mpi_output is not None:
            self._mpi_output.flush()
        info = self.ranks[rank]
        info.returncode = code
        lost = getattr(proc, "lost_reason", None)
        if lost is not None:
            info.state = LOST
        elif self._stopping and info.state == KILLED:
            pass
        else:
            info.state = EXITED
        if code != 0 and info.state != KILLED:
            self.failures.append(rank)
        if self.config.on_exit is not None:
            try:
                self.config.on_exit(rank, code if code is not None else -1)
            except Exception as exc:  # noqa: BLE001
                print(f"mlx-jupyter launch: on_exit callback failed: {exc!r}", file=sys.stderr)
        if code != 0 and info.state != KILLED and self.config.terminate_on_failure and not self._stopping:
            asyncio.ensure_future(self.stop(self.config.grace))
        self._reaped += 1
        if self._reaped == len(self._procs) and self._done is not None:
            self._done.set()

    # ------------------------------------------------------------ controls --
    async def signal(self, sig: int, ranks: Optional[Sequence[int]] = None) -> None:
        """Send ``sig`` to the process groups of ``ranks`` (default: all running ranks)."""
        targets = list(self._procs) if ranks is None else ranks
        await self._signal([r for r in targets if r in self._procs and self.ranks[r].state == RUNNING], sig)

    async def _signal(self, ranks: Sequence[int], sig: int) -> None:
        """Local ranks directly; remote ones with one line to each connection's watchdog."""
        groups: dict[Any, list[int]] = {}
        local = []
        for r in ranks:
            proc = self._procs[r]
            if isinstance(proc, RemoteProcess):
                groups.setdefault(proc.conn, []).append(proc.pid)
            else:
                local.append(proc.signal(sig))
        for conn, pids in groups.items():
            self._watchdogs[conn].signal(pids, sig)
        await asyncio.gather(*local)

    def write_stdin(self, data: bytes) -> None:
        """Broadcast ``data`` to every rank's stdin."""
        for p in self._procs.values():
            p.write(data)

    def close_stdin(self) -> None:
        """Send EOF to every rank's stdin."""
        for p in self._procs.values():
            p.close_stdin()

    async def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for every rank; 0 if all exited 0, else the first failing rank's code."""
        assert self._done is not None, "start() first"
        try:
            await asyncio.wait_for(self._done.wait(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"ranks still running after {timeout:g} s") from None
        await self._cleanup()
        return self.exit_code()

    def exit_code(self) -> int:
        """0, or the code of the first rank that failed (255 for a lost host)."""
        for r in self.failures:
            code = self.ranks[r].returncode
            return 255 if code is None else code
        bad = [i for i in self.ranks if i.returncode not in (0, None)]
        return bad[0].returncode if bad else 0  # type: ignore[return-value]

    async def stop(self, timeout: float = 2.0) -> None:
        """SIGTERM every running rank, SIGKILL after ``grace``, wait up to ``timeout``, clean up."""
        if not self._stopping:
            self._stopping = True
            running = [i.rank for i in self.ranks if i.state == RUNNING]
            for r in running:
                self.ranks[r].state = KILLED
            if running:
                self.log(f"terminating rank(s) {', '.join(map(str, running))}")
                # don't wait for delivery: a host that went silent must not delay the others' KILL
                sends = [asyncio.ensure_future(self.signal_killed(_signal.SIGTERM, running))]
                if not await self._wait_done(min(self.config.grace, timeout)):
                    sends.append(asyncio.ensure_future(self.signal_killed(_signal.SIGKILL, running)))
                    await self._wait_done(max(timeout - self.config.grace, 0.5))
                for task in sends:
                    task.cancel()
        else:
            await self._wait_done(timeout)
        if self._conns and not self._done_set():
            # A host that did not answer TERM/KILL: drop its connection so its
            # ranks count as lost rather than leaving the launcher waiting.
            for conns in self._conns.values():
                for conn in conns:
                    conn.abort()
            await self._wait_done(1.0)
        await self._cleanup()

    def _done_set(self) -> bool:
        return self._done is None or self._done.is_set() or not self._procs

    async def signal_killed(self, sig: int, ranks: Sequence[int]) -> None:
        """Signal ranks whose state is already KILLED (being torn down)."""
        await self._signal([r for r in ranks if r in self._procs and self.ranks[r].returncode is None], sig)

    async def _wait_done(self, timeout: float) -> bool:
        if self._done is None or not self._procs:
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self._done.wait()), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def _cleanup(self) -> None:
        if self._done_set():
            # let each watchdog remove its dir before the connection goes (bounded: a lost host can't answer)
            dogs, self._watchdogs = list(self._watchdogs.values()), {}
            await asyncio.gather(*(dog.close() for dog in dogs))
            for conns in self._conns.values():
                for conn in conns:
                    conn.close()
            self._conns = {}
        if self._guard is not None:
            # after a stop every local rank has been signalled: the guard kills any group left
            guard, self._guard = self._guard, None
            await guard.close()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    # -------------------------------------------------------------- report --
    def summary(self) -> str:
        """One line naming each failed, lost or killed rank with its host and code."""
        parts = []
        if self._mpi_plan is not None and self.failures:
            return self._mpi_summary()
        for r in self.failures:
            i = self.ranks[r]
            if i.state == LOST:
                reason = getattr(self._procs.get(r), "lost_reason", "")
                parts.append(f"rank {r} on {i.host} lost ({reason})")
            else:
                parts.append(f"rank {r} on {i.host} exited with code {_describe(i.returncode)}")
        killed = [i for i in self.ranks if i.state == KILLED]
        if killed:
            parts.append("terminated: " + ", ".join(f"rank {i.rank} on {i.host}" for i in killed))
        return "; ".join(parts)


    def _mpi_summary(self) -> str:
        """mpirun's exit code, and the first failing rank and its host as mpirun reported them."""
        code = f"mpirun exited with code {_describe(self.ranks[0].returncode)}"
        failure = self._mpi_output.failure if self._mpi_output else None
        if failure is None:
            return code
        assert self._mpi_plan is not None
        host = failure.node
        custom = any(k in a for a in self.config.mpi_args for k in ("map-by", "rank-by", "npernode", "rankfile"))
        if host is None and not custom and failure.rank < len(self._mpi_plan.rank_hosts):
            host = self._mpi_plan.rank_hosts[failure.rank]   # Open MPI's default placement
        where = f" on {host}" if host else ""
        return f"rank {failure.rank}{where} {failure.what} (the first to fail, says mpirun); {code}"


def _describe(code: Optional[int]) -> str:
    if code is None:
        return "unknown"
    if code < 0:
        try:
            return f"{code} ({_signal.Signals(-code).name})"
        except ValueError:
            return str(code)
    if code > 128:
        try:
            return f"{code} ({_signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return str(code)
