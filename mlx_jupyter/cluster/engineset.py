"""The ``mlx`` engine-set launcher: ipyparallel engines started as MLX ranks by our launcher.

:class:`MLXEngineSetLauncher` (entry point ``mlx`` in ``ipyparallel.engine_launchers``)
starts one engine per rank through :class:`mlx_jupyter.launch.Launcher`, so each engine
gets its rank's environment contract (``MLX_RANK``, ``MLX_HOSTFILE`` ...), and the engine
requests engine id = rank (:mod:`mlx_jupyter.cluster.rank.engine`). Usable from plain
ipyparallel::

    ipp.Cluster(engines="mlx", n=2)
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar, Union

from ipyparallel.cluster.launcher import EngineLauncher, NotRunning
from traitlets import Any as TAny
from traitlets import Dict, Integer, List, TraitType, Unicode, default

from mlx_jupyter.vocab import rank_env
from mlx_jupyter.vocab.hosts import all_local
from mlx_jupyter.vocab.ports import DEFAULT_STARTING_PORT, free_port_block
from mlx_jupyter.vocab.options import option

if TYPE_CHECKING:
    from mlx_jupyter.hostfile import Host
    from mlx_jupyter.launch import Launcher
    from mlx_jupyter.launch.slurm import SlurmOptions
    from mlx_jupyter.net.ssh import SSHOptions

T = TypeVar("T")
#: a ``traitlets.Any`` trait, as what it holds (``T`` or None): traitlets checks nothing of it
Holds = TraitType[Optional[T], Optional[T]]

#: the ranks' matplotlib backend unless ``env`` sets MPLBACKEND (what an ipyparallel engine picks by itself)
RANK_MPLBACKEND = "module://matplotlib_inline.backend_inline"


class MLXEngineSetLauncher(EngineLauncher):  # type: ignore[misc]  # ipyparallel ships no types: its base is Any
    """ipyparallel engine set: one engine per MLX rank, started by our :class:`Launcher`.

    The number of engines is ``len(hosts) * repeat_hosts`` (like ``mlx.launch``),
    ipyparallel's ``n`` spread over ``hosts`` when ``repeat_hosts`` is 0, or the
    hostfile's length times ``repeat_hosts`` (see :meth:`layout`).
    """

    entrypoint_name = "mlx"

    hosts = List(Unicode(), default_value=["127.0.0.1"], config=True, help="hosts, one per rank (repeated)")
    hostfile = Unicode("", config=True, help="JSON hostfile; overrides hosts")
    hostfile_hosts: Holds[list[Host]] = TAny(
        None, allow_none=True, config=True,
        help="the hostfile's hosts (mlx_jupyter.hostfile.Host), already read: not read again")
    repeat_hosts = Integer(0, config=True, help="ranks per host (0: n spread over hosts)")
    backend = Unicode(config=True, help=option("backend").help)
    python = Unicode(sys.executable, config=True, help="interpreter on the ranks")
    rank_cwd = Unicode("", config=True, help="working directory on every rank")
    starting_port = Integer(0, config=True, help="ring: first port (0: a free block, local hosts only)")
    connections_per_ip = Integer(1, config=True)
    bind_to = Unicode(option("bind_to").default, config=True, help=option("bind_to").help)
    rank_exit_callbacks: List[Callable[[int, Optional[int]], None]] = List(
        help="called as f(rank, returncode) when a rank's process ends")
    rank_output: Dict[int, list[str]] = Dict(
        help="rank -> last lines of its process output (engine logs, native stderr)")
    output_lines = Integer(200, config=True, help="lines of output kept per rank")
    ssh_options: Holds[SSHOptions] = TAny(
        None, allow_none=True, config=True,
        help="mlx_jupyter.net.ssh.SSHOptions for remote hosts (None: OpenSSH defaults)")

    slurm: Holds[SlurmOptions] = TAny(
        None, allow_none=True, config=True,
        help="mlx_jupyter.launch.slurm.SlurmOptions: the ranks as one srun step (nodes x ranks_per_node)")

    launcher: Holds[Launcher] = TAny(None, allow_none=True)

    @default("backend")
    def _default_backend(self) -> str:
        from mlx_jupyter.vocab.backends import default_backend

        return default_backend()

    def file_hosts(self) -> list[Host]:
        """The hostfile's hosts, read once (or as given in ``hostfile_hosts``)."""
        if self.hostfile_hosts is None:
            from mlx_jupyter.hostfile import read_hostfile

            self.hostfile_hosts = list(read_hostfile(self.hostfile).hosts)
        return list(self.hostfile_hosts)

    @default("engine_cmd")
    def _default_engine_cmd(self) -> list[str]:
        return [self.python, "-m", "mlx_jupyter.cluster.rank.engine"]

    def layout(self, n: Optional[int] = None) -> tuple[int, int]:
        """(ranks per host, ranks) for ``n`` engines asked for: ``repeat_hosts`` wins, a
        hostfile repeats its hosts, else ``n`` is spread over ``hosts`` (at least one each)."""
        if self.slurm is not None:
            return self.slurm.ranks_per_node, (self.slurm.nodes or 1) * self.slurm.ranks_per_node
        if self.hostfile or self.hostfile_hosts is not None:
            repeat = max(self.repeat_hosts, 1)
            return repeat, len(self.file_hosts()) * repeat
        repeat = self.repeat_hosts or max(1, (n or 1) // max(len(self.hosts), 1))
        return repeat, len(self.hosts) * repeat

    @property
    def engine_count(self) -> int:
        """What ipyparallel's ``Cluster(n=...)`` starts (it asks this before ``start``)."""
        return self.layout(getattr(self.parent, "n", None))[1]

    def find_args(self) -> list[str]:
        return list(self.engine_cmd) + list(self.engine_args)

    def start(self, n: Optional[int] = None) -> list[Optional[int]]:
        from mlx_jupyter.launch import Launcher

        self.loop  # noqa: B018  (bind the ipyparallel loop on this thread, as ipyparallel's launchers do)
        repeat, count = self.layout(n)
        from_file = self.hostfile_hosts is not None
        # a hostfile Cluster already read (and merged) goes as its hosts; one given only by path is
        # the launcher's to read, with its backend and envs
        hosts: Union[str, list[Host], None] = (self.file_hosts() if from_file
                                               else (self.hostfile or ",".join(self.hosts)))
        self.n = count
        port: Optional[int] = self.starting_port
        if self.slurm is not None:
            hosts, port = None, port or None   # the nodes are the allocation's; ports derived from the job id
        elif not port:
            names = [h.ssh for h in self.file_hosts()] if (from_file or self.hostfile) else self.hosts
            port = free_port_block(count * max(self.connections_per_ip, 1)) if all_local(names) \
                else DEFAULT_STARTING_PORT
        env = dict(self.get_env())
        env.update(rank_env.variables(backend=self.backend, size=count))
        # every rank the same plots, local or remote: not whatever backend the notebook's kernel had
        env.setdefault("MPLBACKEND", RANK_MPLBACKEND)
        self.rank_output = {r: [] for r in range(count)}
        self.launcher = Launcher(
            command=self.find_args(),
            hosts=hosts,
            repeat_hosts=repeat,
            backend=self.backend,
            env=env,
            cwd=self.rank_cwd or None,
            python=self.python,
            starting_port=port,
            bind_to=self.bind_to,
            connections_per_ip=self.connections_per_ip,
            on_output=self._on_output,
            on_exit=self._on_exit,
            terminate_on_failure=False,
            ssh_options=self.ssh_options,
            slurm=self.slurm,
            jaccl_coordinator=False,   # JACCL bootstraps over our core's signed ring: no coordinator port
        )
        self.launcher.start()
        pids = [r.pid for r in self.launcher.ranks]
        self.notify_start(pids)
        return pids

    def _on_output(self, rank: int, stream: str, line: str) -> None:
        lines = self.rank_output.setdefault(rank, [])
        lines.append(line)
        del lines[: -self.output_lines]

    def _on_exit(self, rank: int, returncode: Optional[int]) -> None:
        for cb in list(self.rank_exit_callbacks):
            try:
                cb(rank, returncode)
            except Exception:
                self.log.exception("rank exit callback failed")
        from mlx_jupyter.vocab.rankinfo import LOST

        ranks = self.launcher.ranks if self.launcher else []
        # a rank being stopped counts as done (KILLED) before its process has ended
        if ranks and all(r.done and (r.returncode is not None or r.state == LOST) for r in ranks):
            data = self.stop_data_now()
            self.loop.add_callback(lambda: self.notify_stop(data))

    def stop_data_now(self) -> dict[str, Any]:
        """What ipyparallel is told once every rank has ended: ``exit_code`` is that of the
        first rank that ended by itself with a nonzero code, 0 when every such rank was
        stopped by us (stop, restart: listed in ``stopped``); every rank's code in ``ranks``.

        ipyparallel logs a nonzero code as a warning, with the ranks' whole output.
        """
        from mlx_jupyter.vocab.rankinfo import KILLED

        ranks = self.launcher.ranks if self.launcher else []
        own = [r for r in ranks if r.done and r.state != KILLED and r.returncode != 0]
        data: dict[str, Any] = {
            "exit_code": next((255 if r.returncode is None else r.returncode for r in own), 0),
            "ranks": {r.rank: r.returncode for r in ranks},
        }
        stopped = [r.rank for r in ranks if r.state == KILLED]
        if stopped:
            data["stopped"] = stopped
        return data

    def signal(self, sig: int) -> None:
        if self.launcher is not None:
            self.launcher.signal(sig)

    async def stop(self) -> None:
        if self.launcher is not None:
            await self.launcher.astop(timeout=2.0)
        if self.state != "after":
            self.notify_stop(self.stop_data_now() if self.launcher is not None else {"exit_code": 0})

    def get_output(self, remove: bool = False) -> str:
        return "\n".join(f"[rank {r}] {line}" for r, lines in self.rank_output.items() for line in lines)

    @classmethod
    def from_dict(cls, d: dict[str, Any], **kwargs: Any) -> "MLXEngineSetLauncher":
        raise NotRunning("MLX ranks belong to the process that launched them")

