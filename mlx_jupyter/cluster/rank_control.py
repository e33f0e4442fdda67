"""Control calls to the ranks: abort and status, sent to each rank's control channel (answered
even while a cell blocks the rank's main thread)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from mlx_jupyter.cluster.controller_link import ControllerLink
from mlx_jupyter.cluster.rank_table import RankTable
from mlx_jupyter.cluster.shared.units import format_bytes
from mlx_jupyter.cluster.startup import StartupSequence
from mlx_jupyter.vocab.rankinfo import describe_exit
from mlx_jupyter.vocab.hosts import is_local

if TYPE_CHECKING:
    from mlx_jupyter.where.model import Where


class RankControl:
    """``mlx_abort_request`` and ``mlx_status_request`` to the ranks of ``table`` through ``link``.

    ``rank_infos()`` gives each rank's launch record (rank, host, pid, state) for the status rows;
    ``startup`` says which ranks are still forming MLX's world (they answer nothing meanwhile).
    """

    def __init__(self, link: ControllerLink, table: RankTable, startup: StartupSequence, backend: str,
                 rank_infos: Callable[[], list[Any]]) -> None:
        self.link, self.table, self.startup, self.backend = link, table, startup, backend
        self.rank_infos = rank_infos

    def send_abort(self, reason: str, ranks: Sequence[int],
                   msg_ids: Optional[dict[int, str]] = None, drain: bool = False) -> dict[int, Any]:
        """``mlx_abort_request`` to each rank's control channel; futures of the replies.

        ``msg_ids`` (rank -> request) names the cell to stop on each rank: one that
        has not started there yet is then never run. ``drain``: a rank frozen in an MLX
        collective waits for a drain (:mod:`mlx_jupyter.cluster.drain`) before closing MLX's sockets.
        """
        futures: dict[int, Any] = {}
        if self.link.closed:
            return futures
        ids = self.link.ids()
        for rank in ranks:
            if rank in self.table.dead or rank not in ids:
                continue
            content = {"reason": reason, "msg_id": (msg_ids or {}).get(rank, ""), "drain": drain}
            futures[rank] = self.link.send_control(rank, "mlx_abort_request", content)
        if futures:
            self.table.unsettled = True
        return futures

    def abort(self, reason: str = "aborted by the user", targets: Optional[Sequence[int]] = None,
              timeout: float = 2.0) -> dict[int, bool]:
        """Abort whatever runs on ``targets``; rank -> whether a cell was running there."""
        futures = self.send_abort(reason, self.table.ranks if targets is None else targets)
        self.table.unsettled = True
        out = {}
        for rank, fut in futures.items():
            try:
                out[rank] = bool(fut.result(timeout)["content"].get("was_running"))
            except Exception:
                out[rank] = False
        return out

    def replies(self, timeout: float = 1.0, ranks: Optional[Sequence[int]] = None) -> dict[int, dict[str, Any]]:
        """Each live rank's ``mlx_status_reply`` content (see ``RankAgent.status``), within ``timeout`` s;
        a rank that did not answer is left out."""
        return self._ask("mlx_status_request", ranks, timeout)

    def where_samples(self, ranks: Optional[Sequence[int]] = None, timeout: float = 1.0) -> dict[int, dict[str, Any]]:
        """Each live rank's sample of where it is now (``mlx_where_request``; answered while a cell
        runs too); a rank that did not answer within ``timeout`` s is left out."""
        return self._ask("mlx_where_request", ranks, timeout)

    def _ask(self, msg_type: str, ranks: Optional[Sequence[int]], timeout: float) -> dict[int, dict[str, Any]]:
        """``msg_type`` to each live rank on the control channel; the replies' content within
        ``timeout`` s in all (a rank that did not answer is left out)."""
        ids = self.link.ids()
        futures = {rank: self.link.send_control(rank, msg_type, {})
                   for rank in (self.table.ranks if ranks is None else ranks)
                   if rank not in self.table.dead and rank in ids}
        deadline = time.monotonic() + timeout
        out = {}
        for rank, fut in futures.items():
            try:
                out[rank] = fut.result(max(0.0, deadline - time.monotonic()))["content"]
            except Exception:
                pass
        return out

    def where(self, timeout: float = 1.0) -> Where:
        """Where every rank is now: a :class:`mlx_jupyter.where.model.Where` (a table; ``.rows``, ``.diagnosis``)."""
        from mlx_jupyter.where import model

        samples = self.where_samples(None, timeout)
        ended = {r: "dead" for r in self.table.dead}
        ended.update({r: "no reply" for r in self.table.ranks if r not in samples and r not in ended})
        return model.Where(model.rows(samples, ended, self.table.ranks), "where the ranks are")

    def status(self, timeout: float = 1.0, forming_grace: float = 2.0) -> list[dict[str, Any]]:
        """One row per rank: rank, host, pid, state, backend, memory (bytes), and what the rank says.

        ``cell_started`` is when the rank's current cell began (wall clock, ``time.time()``;
        a remote rank's shifted to this machine's clock), None when idle. Just after start,
        while ranks still form MLX's world, it first waits up to ``forming_grace`` s for them.
        """
        infos = {i.rank: i for i in self.rank_infos()}
        gone = self.link.controller_gone() if self.link.client is not None else ""
        if not gone:
            self.startup.wait_world(forming_grace)
        replies = self.replies(timeout) if self.link.client is not None and not gone else {}
        forming = self.startup.forming_world()
        rows = []
        for rank in self.table.ranks:
            info = infos.get(rank)
            row = {"rank": rank, "host": info.host if info else "?", "pid": info.pid if info else None,
                   "state": "dead" if rank in self.table.dead else (info.state if info else "?"),
                   "backend": self.backend, "memory": None, "memory_text": format_bytes(None), "cell_started": None}
            reply = replies.get(rank)
            if reply is not None:
                row.update(memory=reply.get("rss"), memory_text=format_bytes(reply.get("rss")),
                           busy=reply.get("executing"),
                           world_closed=reply.get("world_closed", ""), group=reply.get("group"),
                           cell_started=_local_clock(reply, info is None or is_local(info.host)))
                row["state"] = "busy" if reply.get("executing") else "idle"
                if rank in forming:
                    row.update(state="forming MLX world", busy=False, cell_started=None)
            elif rank in self.table.dead:
                row["state"] = f"dead ({describe_exit(self.table.dead[rank])})"
            elif gone:
                row["state"] = f"unreachable: {gone}; {self.link.gone_advice()}"
            elif self.link.client is not None and rank in self.link.ids():
                row["state"] = "forming MLX world" if rank in forming else "no reply"
            if self.table.not_running:   # whatever answers, the cluster takes no request until restarted
                row.update(state=f"not running: {self.table.not_running}", busy=False)
            rows.append(row)
        return rows


def _local_clock(reply: Mapping[str, Any], same_clock: bool) -> Optional[float]:
    """The reply's ``cell_started`` (None unless busy) in this machine's clock: a remote rank's
    clock is shifted by its offset from ours, as seen in its reply's ``time`` (within the reply's latency)."""
    started = reply.get("cell_started") if reply.get("executing") else None
    if not isinstance(started, (int, float)):
        return None
    rank_now = reply.get("time")
    if same_clock or not isinstance(rank_now, (int, float)):
        return float(started)
    return float(started) + (time.time() - rank_now)


