"""The Python API: :class:`Launcher`, a synchronous handle over an asyncio :class:`Job`.

Launches run on one shared event loop in a daemon thread, so the sync API can
be used anywhere (a notebook already running its own loop included); the
``a*`` twins are awaitable from any loop. Callbacks run on that loop thread:
keep them short and thread-safe.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import signal as _signal
import sys
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Coroutine, Mapping, Optional, Sequence, TypeVar, Union

from mlx_jupyter.net import ssh
from mlx_jupyter.hostfile import Host
from mlx_jupyter.vocab import binding
from mlx_jupyter.launch.job import ExitCallback, LaunchConfig, LaunchJob, OutputCallback, make_job
from mlx_jupyter.launch.launch_config import TextCallback
from mlx_jupyter.launch.slurm.options import SlurmOptions
from mlx_jupyter.vocab.rankinfo import RankInfo
from mlx_jupyter.vocab.options import option
from mlx_jupyter.vocab.ports import DEFAULT_NCCL_PORT

T = TypeVar("T")

_loop: Optional[asyncio.AbstractEventLoop] = None
_loop_lock = threading.Lock()
_live: "weakref.WeakSet[Launcher]" = weakref.WeakSet()


def _background_loop() -> asyncio.AbstractEventLoop:
    """The shared launcher loop, started on first use."""
    global _loop
    with _loop_lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="mlx-jupyter-launch", daemon=True).start()
            _loop = loop
        return _loop


class Launcher:
    """Run ``command`` on every rank of ``hosts``; see the module doc for threading.

    ``hosts``: a list of :class:`~mlx_jupyter.hostfile.Host`, a hostfile path,
    or ``"h1,h2"``; ``127.0.0.1``/``localhost`` ranks run without ssh. ``repeat_hosts``
    ranks per host (default: :func:`~mlx_jupyter.hostfile.default_ranks_per_host`). A hostfile's
    ``backend`` and ``envs`` apply unless ``backend``/``env`` say otherwise (a notice on
    stderr names each override); with neither, :func:`~mlx_jupyter.vocab.backends.default_backend` (nccl
    where CUDA is available, as ``mlx.launch``, else ring).
    ``rank_env(rank)`` adds env per rank; ``on_output(rank, "stdout"|"stderr",
    line)`` gets each output line, and each piece of an unfinished line as it comes (a prompt);
    ``on_text(rank, stream, text, ends_line)`` gets the same pieces, telling a line's end (default for
    neither: written as it comes, a line continued while the same rank writes it, ``[rank r]`` at line starts);
    ``on_exit(rank, returncode)`` is called as each rank ends (under Slurm ``None`` when no code is
    known: a rank lost, or ended by Slurm). With
    ``backend="mpi"`` mpirun is the one process (``ranks`` has one entry), its
    ranks' lines arrive with their rank (Open MPI) and mpirun's own with -1.
    ``stdin=True`` lets :meth:`write_stdin` feed the ranks; otherwise they read EOF.
    For ring launches our core also binds each port shifted by :func:`~mlx_jupyter.vocab.ports.core_offset`
    (-1000 for the default 32323, else mostly +1000): keep that range free too; ``starting_port``
    defaults to 32323 (under Slurm: a block derived from the job id).
    ``slurm=SlurmOptions(...)`` runs the ranks as one srun step of a Slurm job
    (the current allocation, or a new one held for the launch): no ``hosts``.
    ``bind_to="cores"`` (default) runs each rank started on this machine on its own share of its
    CPUs (:mod:`~mlx_jupyter.vocab.binding`); ``"none"`` leaves placement to the OS.
    No rank outlives this process: if it dies, even by SIGKILL, a watchdog
    (one here, one per ssh connection) kills the ranks and removes their temp files.
    """

    def __init__(
        self,
        command: Sequence[str],
        hosts: Union[str, Path, Sequence[Host], None] = None,
        repeat_hosts: Optional[int] = None,
        backend: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        python: str = sys.executable,
        starting_port: Optional[int] = None,
        connections_per_ip: int = 1,
        rank_env: Optional[Callable[[int], Mapping[str, str]]] = None,
        on_output: Optional[OutputCallback] = None,
        on_exit: Optional[ExitCallback] = None,
        ssh_options: Optional[ssh.SSHOptions] = None,
        *,
        on_text: Optional[TextCallback] = None,
        nccl_port: int = DEFAULT_NCCL_PORT,
        stdin: bool = False,
        terminate_on_failure: bool = True,
        start_timeout: float = 30.0,
        verbose: bool = False,
        mpi_args: Sequence[str] = (),
        slurm: Optional[SlurmOptions] = None,
        bind_to: str = option("bind_to").default,
        jaccl_coordinator: bool = True,
    ):
        self.config = LaunchConfig(
            command=list(command), hosts=hosts, repeat_hosts=repeat_hosts, backend=backend,
            env=dict(env or {}), cwd=cwd, cwd_required=cwd is not None, python=python,
            starting_port=starting_port, connections_per_ip=connections_per_ip, nccl_port=nccl_port,
            rank_env=rank_env, on_output=on_output, on_text=on_text, on_exit=on_exit, ssh_options=ssh_options, stdin=stdin,
            terminate_on_failure=terminate_on_failure, start_timeout=start_timeout, verbose=verbose,
            mpi_args=list(mpi_args), slurm=slurm, bind_to=binding.check_policy(bind_to, "bind_to"),
            jaccl_coordinator=jaccl_coordinator,
        )
        self._job: Optional[LaunchJob] = None

    # ------------------------------------------------------------- helpers --
    @property
    def job(self) -> LaunchJob:
        """The underlying asyncio job (after :meth:`start`)."""
        if self._job is None:
            raise RuntimeError("Launcher.start() has not been called")
        return self._job

    def _run(self, coro: Coroutine[Any, Any, T], timeout: Optional[float] = None) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, _background_loop())
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"launcher operation did not finish within {timeout:g} s") from None

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, _background_loop()))

    async def _start(self) -> None:
        job = self._job = make_job(self.config)
        await job.start()

    # ------------------------------------------------------------- sync API --
    def start(self) -> "Launcher":
        """Spawn every rank; return once all are running, or raise :class:`LaunchError`."""
        if self._job is not None:
            raise RuntimeError("this Launcher has already been started")
        self._run(self._start())
        _live.add(self)
        return self

    @property
    def ranks(self) -> list[RankInfo]:
        """Per-rank info: rank, host, pid (on its host), state, returncode."""
        return list(self._job.ranks) if self._job else []

    @property
    def token(self) -> str:
        """This launch's ``MLX_JUPYTER_TOKEN``."""
        return self.job.token

    def signal(self, sig: int = _signal.SIGINT, ranks: Optional[Sequence[int]] = None) -> None:
        """Send ``sig`` to the process groups of ``ranks`` (default all), remote ones included."""
        self._run(self.job.signal(sig, ranks), timeout=30)

    def write_stdin(self, data: Union[bytes, str]) -> None:
        """Broadcast bytes to every rank's stdin (needs ``stdin=True``)."""
        payload = data.encode() if isinstance(data, str) else data
        _background_loop().call_soon_threadsafe(self.job.write_stdin, payload)

    def close_stdin(self) -> None:
        """Send EOF to every rank's stdin."""
        _background_loop().call_soon_threadsafe(self.job.close_stdin)

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for all ranks; 0 if all exited 0, else the first failing rank's code."""
        job = self.job
        try:
            return self._run(job.wait(timeout), None if timeout is None else timeout + 5)
        finally:
            if all(r.done for r in job.ranks):
                _live.discard(self)

    def stop(self, timeout: float = 2.0) -> None:
        """Terminate every rank's process group (SIGTERM, then SIGKILL) and remove temp files."""
        if self._job is None:
            return
        self._run(self._job.stop(timeout), timeout + 10)
        _live.discard(self)

    def poll(self) -> Optional[int]:
        """The exit code if every rank has ended, else None."""
        job = self.job
        return job.exit_code() if all(r.done for r in job.ranks) else None

    def summary(self) -> str:
        """One line naming failed/lost/terminated ranks (empty when all succeeded)."""
        return self.job.summary()

    # ------------------------------------------------------------ async API --
    async def astart(self) -> "Launcher":
        """:meth:`start`, awaitable from any event loop."""
        if self._job is not None:
            raise RuntimeError("this Launcher has already been started")
        await self._on_loop(self._start())
        _live.add(self)
        return self

    async def asignal(self, sig: int = _signal.SIGINT, ranks: Optional[Sequence[int]] = None) -> None:
        """:meth:`signal`, awaitable."""
        await self._on_loop(self.job.signal(sig, ranks))

    async def await_(self, timeout: Optional[float] = None) -> int:
        """:meth:`wait`, awaitable."""
        return await self._on_loop(self.job.wait(timeout))

    async def astop(self, timeout: float = 2.0) -> None:
        """:meth:`stop`, awaitable."""
        if self._job is not None:
            await self._on_loop(self._job.stop(timeout))
        _live.discard(self)

    def __enter__(self) -> "Launcher":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@atexit.register
def _stop_all() -> None:
    """At interpreter exit, leave no rank running."""
    for launcher in list(_live):
        try:
            launcher.stop(timeout=2.0)
        except Exception:  # noqa: BLE001 - best effort at exit
            pass
