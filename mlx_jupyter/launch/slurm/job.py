"""A launch under Slurm: the allocation, one srun step for every rank, watching it, ending it.

The same face as :class:`mlx_jupyter.launch.job.Job` (``start``, ``wait``,
``stop``, ``signal``, stdin, ``ranks``, ``summary``), so the CLI and
:class:`~mlx_jupyter.launch.Launcher` drive either. srun is one local process
under the launcher's watchdog, which also scancels our allocation (and the
step) if the launcher dies; srun's death ends the step on every node it can
reach. How the step ended is told in :mod:`.ending`.
"""

from __future__ import annotations

import asyncio
import os
import platform
import secrets
import signal as _signal
import sys
import threading
from typing import TYPE_CHECKING, Optional, Sequence

from mlx_jupyter.hostfile import Host
from mlx_jupyter.vocab.backends import RECORDS, get
from mlx_jupyter.launch import contract, where_ask
from mlx_jupyter.launch.launch_config import LaunchConfig, rank_argv
from mlx_jupyter.launch.errors import LaunchError
from mlx_jupyter.launch.local_watchdog import LocalWatchdog
from mlx_jupyter.launch.local import LocalProcess
from mlx_jupyter.vocab.rankinfo import EXITED, KILLED, RUNNING, RankInfo
from mlx_jupyter.launch.slurm import commands
from mlx_jupyter.launch.slurm.allocation import Allocation, WaitCancelled, print_state
from mlx_jupyter.launch.slurm.ending import PROG, Ending
from mlx_jupyter.launch.slurm.options import NAME_PREFIX, SlurmOptions, in_step, split_args, step_argv
from mlx_jupyter.launch.slurm.output import StepOutput
from mlx_jupyter.launch.slurm.plan import derived_port, plan_step, rank_hosts
from mlx_jupyter.launch.slurm.wrapper import wrapper_argv
from mlx_jupyter.launch.streams import LineSplitter
from mlx_jupyter.launch.terminal import TERMINAL
from mlx_jupyter.launch.rank_output import RankOutput
from mlx_jupyter.launch.where_ask import WhereAnswers

if TYPE_CHECKING:
    from mlx_jupyter.where.model import Where

#: Backends whose contract srun can give (jaccl needs each host's RDMA devices from a hostfile).
SLURM_BACKENDS = tuple(b.name for b in RECORDS if b.slurm)


class SlurmJob(Ending):
    """One launch under Slurm. Create, ``await start()``, then ``await wait()``; ``stop()`` tears it down."""

    def __init__(self, config: LaunchConfig):
        self.config = config
        self.opts: SlurmOptions = config.slurm or SlurmOptions()
        self.token = secrets.token_hex(16)
        backend = config.backend or "ring"
        if backend not in SLURM_BACKENDS:
            raise LaunchError(f"--backend {backend} is not available with Slurm: use {', '.join(SLURM_BACKENDS)} "
                              "(jaccl needs each host's RDMA devices from a hostfile)")
        config.backend = self.backend = backend
        if config.rank_env is not None:
            raise LaunchError("rank_env is not available with Slurm: srun gives every task the same environment "
                              "(each rank has MLX_RANK, SLURM_PROCID and SLURM_LOCALID)")
        if self.opts.ranks_per_node < 1 or (self.opts.nodes is not None and self.opts.nodes < 1):
            raise LaunchError("--nodes and -n must be positive")
        self.name = self.opts.job_name or NAME_PREFIX + secrets.token_hex(4)
        self.allocation: Optional[Allocation] = None
        self.step: Optional[str] = None            # "job.step" once the first rank reports it
        self.hosts: list[Host] = []
        self.ranks: list[RankInfo] = []
        self.failures: list[int] = []
        self._srun: Optional[LocalProcess] = None
        self._output: Optional[StepOutput] = None
        self._rank_output = RankOutput(config, lambda: self.size)
        self._srun_code: Optional[int] = None
        self._guard: Optional[LocalWatchdog] = None
        self._done: Optional[asyncio.Event] = None
        self._started: Optional[asyncio.Event] = None
        self._cancel = threading.Event()           # wakes a wait for a pending job
        self._stopping = False
        self._fail_timer: Optional[asyncio.TimerHandle] = None
        self._tasks: list[asyncio.Task[object]] = []   # held: the loop keeps only weak references to tasks
        self.end_note = ""
        self._told: set[int] = set()
        self._lost_why: dict[str, str] = {}
        self.where_answers = WhereAnswers()        # the ranks' answers to SIGUSR1 (--where-on-signal)

    # ------------------------------------------------------------- starting --
    @property
    def size(self) -> int:
        """Number of ranks (as asked for, until the allocation's nodes are known)."""
        return len(self.hosts) or (self.opts.nodes or 1) * self.opts.ranks_per_node

    def log(self, msg: str) -> None:
        if self.config.verbose:
            TERMINAL.say(f"{PROG}: {msg}")

    async def start(self) -> None:
        """Get the nodes, start srun; return once every rank runs, or tear down and raise."""
        self._done = asyncio.Event()
        self._started = asyncio.Event()
        try:
            await self._start()
        except BaseException:
            await self.stop(self.config.grace)
            raise

    async def _start(self) -> None:
        slurm_env = {k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "SLURMD_"))}
        try:
            self._guard = await LocalWatchdog.start(slurm_env)
        except OSError as exc:
            raise LaunchError(f"cannot start the launcher's watchdog (/bin/sh): {exc}") from None
        if self.opts.job_id is not None:
            current: Optional[Allocation] = Allocation(self.opts.job_id, owned=False)
        else:
            current = None if self.opts.allocate else Allocation.current(os.environ)
        if current is not None:
            self.allocation = current
            self.log(f"running inside Slurm job {current.job_id}")
        else:
            self._guard.register_job(f"name={self.name}")   # before sbatch: we may die before it answers
            self.allocation = await asyncio.to_thread(Allocation.submit, self.opts, self.name)
            if self._cancel.is_set():   # stopped while sbatch ran (the watchdog may be closed already)
                await asyncio.to_thread(self.allocation.release)
                raise WaitCancelled(f"Slurm job {self.allocation.job_id} cancelled before it ran")
            self._guard.register_job(str(self.allocation.job_id))
            await asyncio.to_thread(self.allocation.wait_running, self._cancel, self.opts.poll_interval,
                                    self.opts.on_state or print_state(PROG))
        nodes = await asyncio.to_thread(self.allocation.nodes)
        if self.opts.nodes is not None:
            if self.opts.nodes > len(nodes):
                raise LaunchError(f"--nodes {self.opts.nodes}: Slurm job {self.job_id} has only "
                                  f"{len(nodes)} node(s) ({', '.join(nodes)})")
            subset = self.opts.nodes < len(nodes)
            nodes = nodes[: self.opts.nodes]
        else:
            subset = False
        info = await asyncio.to_thread(commands.nodes_info, nodes)
        ips = {n: await asyncio.to_thread(commands.node_ip, info[n]) for n in nodes}
        self.hosts = rank_hosts(nodes, ips, self.opts.ranks_per_node)
        self.ranks = [RankInfo(r, h.ssh) for r, h in enumerate(self.hosts)]
        await self._start_step(nodes, subset)

    def _plan(self) -> dict[str, str]:
        c = self.config
        port = c.starting_port or derived_port(self.job_id or 0, len(self.hosts), c.connections_per_ip)
        mpi_env = None
        if get(self.backend).mpirun:
            from mlx_jupyter.launch.mpi import find_libmpi

            libname, libdir = find_libmpi()
            mpi_env = contract.plan_mpi(self.hosts, env=dict(c.env), token=self.token, libname=libname,
                                        libdir=libdir, darwin=platform.system() == "Darwin",
                                        inherited=os.environ).env
        try:
            plan = plan_step(self.backend, self.hosts, env=dict(c.env), token=self.token, starting_port=port,
                             connections_per_ip=c.connections_per_ip, nccl_port=c.nccl_port, verbose=c.verbose,
                             mpi_env=mpi_env, frame_with=c.python)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        return plan.env

    async def _start_step(self, nodes: list[str], subset: bool) -> None:
        c = self.config
        env = {**os.environ, **self._plan()}
        if not get(self.backend).mpirun:   # mpi ranks share output lines: unbuffered fragments would interleave
            env.setdefault("PYTHONUNBUFFERED", "1")
        # the current allocation (not ours, not one held for us): --slurm-arg options are srun's
        explicit = self.allocation is not None and not self.allocation.owned and self.opts.job_id is None
        try:
            extra = split_args(self.opts.srun_args, "--srun-arg") + (split_args(self.opts.args) if explicit else [])
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        mpi = None
        if get(self.backend).mpirun and not any(a.startswith("--mpi") for a in extra):
            mpi = await asyncio.to_thread(commands.mpi_plugin)
        argv = step_argv(self.job_id or 0, nodes, self.opts.ranks_per_node, name=self.name, stdin=c.stdin,
                         kill_on_bad_exit=c.terminate_on_failure, subset=subset, mpi=mpi,
                         in_step=explicit and in_step(os.environ), extra=extra)
        argv += wrapper_argv(self.where_answers.boot(rank_argv(c.command, c.python, c.cwd), c.where_on_signal))
        self.log(f"starting {self.size} rank(s) on {', '.join(nodes)} in Slurm job {self.job_id}")
        output = self._output = StepOutput(self.size, self._emit, self._on_start, self._on_rank_exit)
        # srun's lines, a piece of one as a line (as before: srun labels what it passes on)
        out = LineSplitter(lambda text, _: output.line("stdout", text))
        err = LineSplitter(lambda text, _: output.line("stderr", text))
        if c.cwd is not None and not os.path.isdir(c.cwd):
            raise LaunchError(f"working directory {c.cwd!r} does not exist here, where srun runs (--cwd)")
        self._srun = await LocalProcess.spawn(argv, env, c.cwd, c.stdin, out, err, "srun", self._guard)
        self._tasks.append(asyncio.ensure_future(self._watch_srun()))
        assert self._done is not None and self._started is not None, "start() first"
        done, all_started = self._done, self._started
        ended = asyncio.ensure_future(done.wait())
        started = asyncio.ensure_future(all_started.wait())
        try:
            await asyncio.wait({ended, started}, timeout=c.start_timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            started.cancel()
        if not all_started.is_set() and not done.is_set():
            waiting = [str(i.rank) for i in self.ranks if i.state != RUNNING and not i.done]
            raise LaunchError(f"Slurm job {self.job_id}: rank(s) {', '.join(waiting)} did not start within "
                              f"{c.start_timeout:g} s (srun said: {self.srun_said() or 'nothing'})")

    # -------------------------------------------------------------- running --
    def _emit(self, rank: int, stream: str, text: str, ends: bool) -> None:
        shown = self.where_answers.piece(rank, stream, text, ends)
        if shown is not None:
            self._rank_output(rank, stream, shown, ends)

    async def where(self, timeout: float = 2.0) -> Where:
        """Where every rank is: SIGUSR1 to the step (``scancel --signal=USR1``; the task wrapper lets it
        pass), the answers of the ranks started with ``where_on_signal`` within ``timeout`` s."""
        ranks = [i.rank for i in self.ranks]
        running = [i.rank for i in self.ranks if i.state == RUNNING]
        ended = {i.rank: where_ask.ended_words(i) for i in self.ranks if i.state != RUNNING}
        asked = running if self.config.where_on_signal else []
        samples = await self.where_answers.ask(asked, lambda: self.signal(_signal.SIGUSR1), timeout)
        return where_ask.table(samples, ended, ranks, bool(asked) and self.where_answers.booted)

    def _on_start(self, rank: int, step: str, pid: int) -> None:
        info = self.ranks[rank]
        if info.state == "pending":
            info.state, info.pid = RUNNING, pid
        if self.step is None and step.isdigit() and self.job_id is not None:
            self.step = f"{self.job_id}.{step}"
            if self._guard is not None:
                self._guard.register_job(self.step)
        if all(i.state != "pending" for i in self.ranks) and self._started is not None:
            self._started.set()

    def _on_rank_exit(self, rank: int, code: int) -> None:
        info = self.ranks[rank]
        if info.returncode is not None:
            return
        info.returncode = code
        if info.state != KILLED:
            info.state = EXITED
        if code != 0 and (info.state != KILLED or self._fail_timer is not None):
            self.failures.append(rank)   # kept in order; settled at the end (ending._settle_failures)
        self._tell_exit(rank, code)
        if (code != 0 and info.state == EXITED and self.config.terminate_on_failure and not self._stopping
                and self._fail_timer is None):
            # srun's --kill-on-bad-exit ends the others (terminated, not failed, as Job's stop marks them);
            # a node that went silent never reports: then we end the step ourselves
            for other in self.ranks:
                if not other.done:
                    other.state = KILLED
            loop = asyncio.get_running_loop()
            self._fail_timer = loop.call_later(self.opts.failure_grace,
                                               lambda: self._tasks.append(asyncio.ensure_future(self.stop())))

    async def _watch_srun(self) -> None:
        assert self._srun is not None
        self._srun_code = await self._srun.wait()
        if self._output is not None:   # a rank lost with its last line unfinished
            self._output.end_lines()
        if self._fail_timer is not None:
            self._fail_timer.cancel()
        await self._conclude()
        if self._started is not None:
            self._started.set()
        assert self._done is not None
        self._done.set()

    async def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for srun (every rank) to end; 0 if all exited 0, else the first failing rank's code."""
        assert self._done is not None, "start() first"
        try:
            await asyncio.wait_for(self._done.wait(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"ranks still running after {timeout:g} s") from None
        await self._cleanup()
        return self.exit_code()

    async def signal(self, sig: int, ranks: Optional[Sequence[int]] = None) -> None:
        """Send ``sig`` to every rank (Slurm signals whole steps: ``ranks`` cannot pick some)."""
        if self._srun is None or self._done is None or self._done.is_set():
            if sig in (_signal.SIGINT, _signal.SIGTERM) and self._srun is None:
                self._cancel.set()   # still waiting for the allocation: give up on it
            return
        if self.step is not None:
            name = _signal.Signals(sig).name.removeprefix("SIG")
            await asyncio.to_thread(commands.cancel, self.step, name)
        elif sig != _signal.SIGINT:   # srun passes signals on to the tasks, but takes SIGINT for itself
            await self._srun.signal(sig)

    def write_stdin(self, data: bytes, rank: Optional[int] = None) -> None:
        """Broadcast ``data`` to every rank's stdin (srun --input=all: ``rank`` cannot pick one)."""
        _one_stream(rank)
        if self._srun is not None:
            self._srun.write(data)

    def close_stdin(self, others_than: Optional[int] = None) -> None:
        """EOF to every rank's stdin (srun's one stream: ``others_than`` cannot keep one open)."""
        _one_stream(others_than)
        if self._srun is not None:
            self._srun.close_stdin()

    # ------------------------------------------------------------- stopping --
    async def stop(self, timeout: float = 2.0) -> None:
        """End every rank (TERM, then KILL after ``grace``), release our allocation, clean up."""
        self._cancel.set()
        if not self._stopping:
            self._stopping = True
            for info in self.ranks:
                if not info.done:
                    info.state = KILLED
            if self._srun is not None and self._done is not None and not self._done.is_set():
                await self._end_step(timeout)
        elif self._done is not None and self._srun is not None:
            await self._wait_done(timeout)
        await self._cleanup()

    async def _end_step(self, timeout: float) -> None:
        """SIGTERM to srun (it passes it on to every task), SIGKILL after ``grace`` (srun's end ends the
        step on every node it reaches). scancel is not waited for: it blocks while a node is unreachable."""
        assert self._srun is not None
        grace = min(self.config.grace, timeout)
        self.log(f"terminating Slurm step {self.step or '(not started)'}")
        await self._srun.signal(_signal.SIGTERM)
        if not await self._wait_done(grace):
            await self._srun.signal(_signal.SIGKILL)
            if self.step is not None:   # for the nodes srun could not reach (ours is released, which ends it all)
                self._tasks.append(asyncio.ensure_future(asyncio.to_thread(commands.cancel, self.step)))
            await self._wait_done(max(timeout - grace, 1.0))

    async def _wait_done(self, timeout: float) -> bool:
        if self._done is None:
            return True
        try:
            await asyncio.wait_for(asyncio.shield(self._done.wait()), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def _cleanup(self) -> None:
        """Release our allocation; once srun has ended, tell the watchdog what no longer needs cancelling."""
        alloc = self.allocation
        if alloc is not None and alloc.owned and not alloc.released:
            await asyncio.to_thread(alloc.release)
        if self._guard is None or not (self._done is None or self._done.is_set() or self._srun is None):
            return
        guard, self._guard = self._guard, None
        if self.step is not None:   # srun's end ended it wherever srun could reach; our release does the rest
            guard.unregister_job(self.step)
        if alloc is not None and alloc.owned and alloc.released:
            guard.unregister_job(str(alloc.job_id))
            guard.unregister_job(f"name={self.name}")
        await guard.close()


def _one_stream(rank: Optional[int]) -> None:
    """LaunchError when a caller picks one rank's stdin: srun feeds every task from one stream."""
    if rank is not None:
        raise LaunchError("with Slurm every rank reads one stdin (srun --input=all): a rank's own stdin "
                          "(--stdin-rank) works with ranks this launcher starts itself")
