"""Cluster control calls: abort and status, sent straight to each rank's control channel."""

from __future__ import annotations

import time
from typing import Any, Mapping, Optional, Sequence

from mlx_jupyter.cluster.cells.text import describe_exit, format_bytes
from mlx_jupyter.cluster.shared.ipp_compat import is_closed, send_control
from mlx_jupyter.net.hosts import is_local


class Control:
    """Part of :class:`~mlx_jupyter.cluster.handle.Cluster`: ``mlx_abort_request`` and ``mlx_status_request``."""

    def send_abort(self, reason: str, ranks: Sequence[int],
                   msg_ids: Optional[dict[int, str]] = None) -> dict[int, Any]:
        """``mlx_abort_request`` to each rank's control channel; futures of the replies.

        ``msg_ids`` (rank -> request) names the cell to stop on each rank: one that
        has not started there yet is then never run.
        """
        client = self.client
        futures: dict[int, Any] = {}
        if is_closed(client):
            return futures
        for rank in ranks:
            if rank in self.dead or rank not in client.ids:
                continue
            content = {"reason": reason, "msg_id": (msg_ids or {}).get(rank, "")}
            futures[rank] = send_control(client, rank, "mlx_abort_request", content)
        return futures

    def abort(self, reason: str = "aborted by the user", targets: Optional[Sequence[int]] = None,
              timeout: float = 2.0) -> dict[int, bool]:
        """Abort whatever runs on ``targets``; rank -> whether a cell was running there."""
        futures = self.send_abort(reason, self.ranks if targets is None else targets)
        self.needs_reform = True
        out = {}
        for rank, fut in futures.items():
            try:
                out[rank] = bool(fut.result(timeout)["content"].get("was_running"))
            except Exception:
                out[rank] = False
        return out

    def status(self, timeout: float = 1.0, forming_grace: float = 2.0) -> list[dict]:
        """One row per rank: rank, host, pid, state, backend, memory (bytes), and what the rank says.

        ``cell_started`` is when the rank's current cell began (wall clock, ``time.time()``;
        a remote rank's shifted to this machine's clock), None when idle. Just after start,
        while ranks still form MLX's world, it first waits up to ``forming_grace`` s for them.
        """
        rows = []
        client = self.client
        infos = {i.rank: i for i in self.rank_infos()}
        futures = {}
        if self.forming_world():  # just started: a moment more gives the ranks' real state
            try:
                self._world_ar.wait(forming_grace)
            except Exception:
                pass
        if client is not None:
            for rank in self.ranks:
                if rank in self.dead or rank not in client.ids:
                    continue
                futures[rank] = send_control(client, rank, "mlx_status_request", {})
        deadline = time.monotonic() + timeout
        for rank in self.ranks:
            info = infos.get(rank)
            row = {"rank": rank, "host": info.host if info else "?", "pid": info.pid if info else None,
                   "state": "dead" if rank in self.dead else (info.state if info else "?"),
                   "backend": self.backend, "memory": None, "memory_text": format_bytes(None), "cell_started": None}
            fut = futures.get(rank)
            if fut is not None:
                try:
                    reply = fut.result(max(0.0, deadline - time.monotonic()))["content"]
                    row.update(memory=reply.get("rss"), memory_text=format_bytes(reply.get("rss")),
                               busy=reply.get("executing"),
                               world_closed=reply.get("world_closed", ""), group=reply.get("group"),
                               cell_started=_local_clock(reply, info is None or is_local(info.host)))
                    row["state"] = "busy" if reply.get("executing") else "idle"
                    if rank in self.forming_world():
                        row.update(state="forming MLX world", busy=False, cell_started=None)
                except Exception:
                    row["state"] = "forming MLX world" if rank in self.forming_world() else "no reply"
            elif rank in self.dead:
                row["state"] = f"dead ({describe_exit(self.dead[rank])})"
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


