"""Cluster supervision: dead and busy ranks, bounded waits for requests, stopping a request, cell runs."""

from __future__ import annotations

import time
from typing import Any, Iterable, Optional, Sequence

from mlx_jupyter.cluster.cells.text import describe_exit, rank_label
from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.cluster.shared.ipp_compat import send_execute


class Supervision:
    """Part of :class:`~mlx_jupyter.cluster.handle.Cluster`: what happens when ranks die, hang or are interrupted."""

    def _dead_message(self, what: str, tail: bool = False) -> str:
        lines = [f"rank {r} {what}: {describe_exit(rc)}" for r, rc in sorted(self.dead.items())]
        if tail:
            lines.append(self._tail(sorted(self.dead)))
        return "\n".join(line for line in lines if line)

    def _tail(self, ranks: Iterable[int], n: int = 15) -> str:
        try:
            out = self.engine_set.rank_output
        except Exception:
            return ""
        parts = []
        for r in ranks:
            lines = out.get(r, [])[-n:]
            if lines:
                parts.append(f"last output of rank {r}:\n  " + "\n  ".join(lines))
        job = out.get(-1, [])[-n:]  # the launcher's own (mpirun's) output, not one rank's
        if job:
            parts.append("last output of the launcher:\n  " + "\n  ".join(job))
        return "\n".join(parts)

    def _on_rank_exit(self, rank: int, returncode: Optional[int]) -> None:
        """A rank's process ended (launcher thread)."""
        if self._stopping:
            return
        self.dead[rank] = returncode
        self._changed.set()
        if self.hub is not None:
            self.hub.forget([rank])
        self._unregister([rank])
        for run in list(self._runs):
            run.rank_died(rank, returncode)
        for cb in list(self.rank_exit_callbacks):
            try:
                cb(rank, returncode)
            except Exception:
                pass

    def check_ranks(self, ranks: Sequence[int]) -> None:
        """Raise a clear error if a rank is dead or still busy with an earlier cell."""
        self._need_client()
        dead = [r for r in ranks if r in self.dead]
        if dead:
            raise ClusterError(self._dead_message("is dead") + "\nrestart the ranks: %mlx_cluster restart")
        busy = [r for r in ranks if r in self.busy and not self.busy[r].done()]
        if busy:
            raise ClusterError(
                f"{rank_label(busy)} still running an earlier cell that did not stop; "
                "interrupt it, or %mlx_cluster restart"
            )
        for r in ranks:
            self.busy.pop(r, None)

    def wait(self, ar: Any, timeout: Optional[float], ranks: Sequence[int], what: str = "the request") -> Any:
        """Wait for an AsyncResult; fail at once if one of ``ranks`` dies, or after ``timeout``.

        A KeyboardInterrupt (the stop button) stops the request on the ranks too
        (:meth:`_stop_request`) before it is raised again.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not ar.ready():
                dead = [r for r in ranks if r in self.dead]
                if dead:
                    raise ClusterError(self._dead_message(f"died during {what}"))
                if deadline is not None and time.monotonic() > deadline:
                    raise ClusterError(f"{what} did not finish within {timeout:g} s")
                ar.wait(0.05)
        except KeyboardInterrupt:
            left = self._stop_request(ar, ranks, f"{what} interrupted by the user")
            note = f"; {rank_label(left)} did not stop yet (busy)" if left else ""
            raise KeyboardInterrupt(f"{what} interrupted; stopped on the ranks{note}") from None
        return ar.get()

    def _stop_request(self, ar: Any, ranks: Sequence[int], reason: str, grace: float = 2.0) -> list[int]:
        """Abort ``ar``'s request on every rank (queued ones never run); the ranks still busy after ``grace`` s."""
        msg_ids = dict(zip(ranks, getattr(ar, "msg_ids", [])))
        self.send_abort(reason, ranks, msg_ids)
        self.needs_reform = True
        end = time.monotonic() + grace
        while not ar.ready() and time.monotonic() < end:
            ar.wait(0.05)
        client = self.client
        left = [r for r, m in msg_ids.items() if client is not None and m in client.outstanding]
        for rank in left:
            self.busy[rank] = _Outstanding(client, msg_ids[rank])
        return left

    def run(self, code: str, targets: Optional[Sequence[int]] = None, release_deadline: float = 2.0) -> Any:
        """Start a supervised run of ``code`` on ``targets`` (default all); see :class:`CellRun`."""
        from mlx_jupyter.cluster.cells.run import CellRun

        ranks = list(self.ranks if targets is None else targets)
        self.check_ranks(ranks)
        return CellRun(self, code, ranks, release_deadline).start()

    # ------------------------------------------------------------ what a cell run needs (cells.run.RunHost)

    def run_started(self, run: Any) -> None:
        self._runs.add(run)

    def run_ended(self, run: Any) -> None:
        self._runs.discard(run)

    def mark_busy(self, rank: int, request: Any) -> None:
        """``rank`` still runs ``request`` (anything with ``done()``): no new cell goes there until it ends."""
        self.busy[rank] = request

    def send_execute(self, rank: int, code: str, hook: Any) -> str:
        """Send ``code`` to ``rank`` through the controller; see :func:`ipp_compat.send_execute`."""
        return send_execute(self.client, rank, code, hook)


class _Outstanding:
    """A request the client still waits for, as :meth:`Supervision.check_ranks` asks (``done()``)."""

    def __init__(self, client: Any, msg_id: str):
        self.client, self.msg_id = client, msg_id

    def done(self) -> bool:
        return self.msg_id not in self.client.outstanding
