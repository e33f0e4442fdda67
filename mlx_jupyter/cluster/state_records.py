"""The per-cell record of each rank's own names (opt-in: ``Cluster(record_state=True)``,
``%mlx_cluster start --record-state``), from the notebook's side: switch it on the ranks after a
start and a restart, restore a dead rank's names from it at a restart, remove its folders at stop.
The rank side is :mod:`mlx_jupyter.cluster.rank.state_record`; the folder is a keep folder of
:mod:`mlx_jupyter.cluster.rank.keep_files` (named after this process: swept if it dies)."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol, Sequence

from mlx_jupyter.cluster.rank import keep_files
from mlx_jupyter.cluster.shared.errors import ClusterError

if TYPE_CHECKING:
    from mlx_jupyter.cluster.channel_calls import CallChannel
    from mlx_jupyter.cluster.controller_link import ControllerLink
    from mlx_jupyter.cluster.rank_table import RankTable
    from mlx_jupyter.cluster.supervision import Supervisor
    from mlx_jupyter.vocab.rankinfo import RankInfo
    from mlx_jupyter.net.ssh import SSHOptions


class CallTarget(Protocol):
    """What a call to the ranks needs of a cluster: the cell channel, else the controller under supervision."""

    @property
    def cell_server(self) -> Optional[CallChannel]: ...
    @property
    def table(self) -> RankTable: ...
    @property
    def link(self) -> ControllerLink: ...
    @property
    def supervisor(self) -> Supervisor: ...


class RecordedCluster(CallTarget, Protocol):
    """What switching the record needs of a cluster besides: whether it runs, and its ranks' hosts."""

    @property
    def running(self) -> bool: ...
    def rank_infos(self) -> Sequence[RankInfo]: ...


class StoppedCluster(Protocol):
    """What removing the record's folders needs of a cluster: how to reach its hosts."""

    @property
    def ssh_options(self) -> Optional[SSHOptions]: ...


class StateRecords:
    """Cluster ``cluster``'s record folder (one per host) and its switch."""

    def __init__(self, cluster_id: str, on: bool = False) -> None:
        self.on = on
        self.dirname = keep_files.folder_name(cluster_id, secrets.token_hex(8))
        self.hosts: set[str] = set()   # the hosts a record may be on (for the removal at stop)
        self.errors: dict[int, str] = {}

    def switch(self, cluster: RecordedCluster, on: Optional[bool] = None, timeout: float = 30.0) -> dict[int, Any]:
        """Turn the record on (or off) on every live rank; rank -> its answer (an error as a string)."""
        from mlx_jupyter.cluster.rank import state_record

        if on is not None:
            self.on = on
        table = cluster.table
        live = [r for r in table.ranks if r not in table.dead]
        if not live or not cluster.running:
            return {}
        self.hosts |= {i.host for i in cluster.rank_infos()}
        if self.on:
            answers = call(cluster, state_record.enable, {r: [self.dirname, r] for r in live}, timeout,
                           "switching the state record on")
        else:
            answers = call(cluster, state_record.disable, {r: [] for r in live}, timeout,
                           "switching the state record off")
        self.errors = {r: str(a) for r, a in answers.items() if isinstance(a, Exception)}
        return answers

    def describe(self, cluster: CallTarget, wait: float = 0.0, timeout: float = 30.0) -> dict[int, Any]:
        """Each live rank's record: cell, names, bytes written, seconds (``wait``: for a record in progress)."""
        from mlx_jupyter.cluster.rank import state_record

        live = [r for r in cluster.table.ranks if r not in cluster.table.dead]
        return call(cluster, state_record.describe, {r: [wait] for r in live}, timeout, "reading the state record")

    def cleanup(self, cluster: StoppedCluster) -> None:
        """Remove the record's folder on every host it may be on (at stop)."""
        if not self.hosts:
            return
        from mlx_jupyter.cluster.keep_cleanup import remove_on_hosts
        from mlx_jupyter.vocab.hosts import is_local

        if any(is_local(h) for h in self.hosts):
            keep_files.remove_all(self.dirname)
        remove_on_hosts({h: [self.dirname] for h in self.hosts}, cluster.ssh_options)
        self.hosts = set()


def call(cluster: CallTarget, fn: Callable[..., Any], calls: dict[int, list[Any]], timeout: float,
         what: str) -> dict[int, Any]:
    """``fn(*args)`` on each rank of ``calls``: over the cell channel when it reaches them, else
    through the controller; rank -> its answer or the exception that stands for it."""
    from mlx_jupyter.cluster import channel_calls

    cell_server = cluster.cell_server
    if channel_calls.usable(cell_server, list(calls)):
        return channel_calls.call_ranks(cell_server, fn, calls, timeout, lambda: cluster.table.dead, what)
    out: dict[int, Any] = {}
    for r, args in calls.items():
        try:
            out[r] = cluster.supervisor.wait(cluster.link.view([r]).apply_async(fn, *args), timeout, [r], what)
        except Exception as exc:  # noqa: BLE001 - the rank's error, as one line
            out[r] = ClusterError(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
    return out
