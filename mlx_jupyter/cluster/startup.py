"""A cluster's start-up sequence: until every rank is registered, answers requests, has its agent
and is on the cell channel; then MLX's world begins to form in the background."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_any
from typing import Any, Callable, Optional, Protocol

from mlx_jupyter.vocab import backends
from mlx_jupyter.cluster.cells.text import rank_label
from mlx_jupyter.cluster.controller_link import ControllerLink
from mlx_jupyter.cluster.rank_table import RankTable
from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.cluster.shared.ipp_compat import IPP_FIX

ProgressCallback = Callable[[int, int], None]
log = logging.getLogger("mlx_jupyter.cluster")


class ChannelServer(Protocol):
    """What the start-up needs of the direct cell channel (:class:`~mlx_jupyter.cluster.cells.cell_server.CellServer`)."""

    def wait_connected(self, ranks: list[int], timeout: float) -> list[int]: ...


class RankRequest(Protocol):
    """A request in flight on some ranks, one message each (ipyparallel's ``AsyncResult``)."""

    @property
    def msg_ids(self) -> list[str]: ...
    def wait(self, timeout: Optional[float] = None) -> object: ...


class StartupSequence:
    """Waits for the ranks of a (re)start: registered with id = rank, answering requests with
    their agent installed, on the cell channel (``cell_server()``, None without one); then asks them to
    form MLX's world (``backend`` ring) in the background."""

    def __init__(self, link: ControllerLink, table: RankTable, backend: str,
                 cell_server: Callable[[], Optional[ChannelServer]] = lambda: None) -> None:
        self.link, self.table, self.backend, self.cell_server = link, table, backend, cell_server
        self.world_request: Optional[RankRequest] = None  # the ranks forming MLX's world after start (begin_world)

    def run(self, progress: Optional[ProgressCallback], timeout: float) -> None:
        """The whole sequence, within ``timeout`` s; a ClusterError says which rank did not make it."""
        deadline = time.monotonic() + timeout
        self.wait_registered(progress, deadline, timeout)
        self.probe_channels(deadline)
        self.begin_world()

    def wait_registered(self, progress: Optional[ProgressCallback], deadline: float, timeout: float) -> None:
        """Until every rank's engine is registered with its rank as engine id."""
        table, client = self.table, self.link.need()
        wanted = set(table.ranks)
        last = -1
        while True:
            ids = set(client.ids)
            have = len(ids & wanted)
            if have != last and progress:
                progress(have, table.size)
            last = have
            if ids >= wanted:
                return
            if ids - wanted:
                raise ClusterError(f"engines registered with ids {sorted(ids - wanted)}, not their ranks")
            if table.dead:
                raise ClusterError(table.dead_message("did not start", tail=True))
            if time.monotonic() > deadline:
                missing = sorted(wanted - ids)
                raise ClusterError(f"{rank_label(missing)} not connected after {timeout:g} s\n{table.tail(missing)}")
            table.changed.wait(0.01)
            table.changed.clear()

    def probe_channels(self, deadline: float, patience: float = 0.05, most: float = 0.2) -> None:
        """Until every rank has answered on its request channel (the one cells use),
        saying that its rank agent is installed.

        The controller routes to an engine by identity and silently drops what
        reaches it before that engine's own connection is up; ipyparallel lists an
        engine once its heartbeat arrives, which need not come after. A probe that
        gets no answer within ``patience`` s is sent again, the patience doubling up
        to ``most`` s (the connection is usually up a few ms later; a loaded machine
        gets longer), so the first cell never goes to a rank that cannot hear it.
        (Control needs no probe: status and abort are used with timeouts and
        deadlines.) The agent is installed before the engine handles its first
        request, so the answer is final.
        """
        from mlx_jupyter.cluster.rank.agent import PROBE_CODE

        client = self.link.need()
        dead = self.table.dead
        pending = set(self.table.ranks)
        answers: dict[int, dict[str, Any]] = {}
        sent: dict[int, list[Future[Any]]] = {rank: [] for rank in pending}
        while pending:
            for rank in pending:
                sent[rank].append(client.direct_view(targets=rank).execute(PROBE_CODE, silent=True, block=False))
            until = min(deadline, time.monotonic() + patience)
            patience = min(patience * 2, most)
            while pending and not dead:
                for rank in list(pending):
                    done = [f for f in sent[rank] if f.done()]  # an earlier probe may be the one that got through
                    if done:
                        answers[rank] = probe_answer(done[0])
                        pending.discard(rank)
                left = until - time.monotonic()
                if not pending or left <= 0:
                    break
                wait_any([f for r in pending for f in sent[r]], left, FIRST_COMPLETED)
            if dead:
                raise ClusterError(self.table.dead_message("did not start", tail=True))
            if pending and time.monotonic() > deadline:
                raise ClusterError(f"{rank_label(sorted(pending))} registered but never answered a request")
        # probes the controller dropped (sent before the engine's connection was up) never get an
        # answer: they must not count as requests still running, or no cell would take the channel
        self.link.stray_probes = {m for futures in sent.values() for f in futures if not f.done()
                                  for m in getattr(f, "msg_ids", ())}
        bad = {r: a for r, a in sorted(answers.items()) if not a.get("installed")}
        if bad:
            lines = [f"rank {r}: the rank agent (abort, status) is not installed: {a.get('error')} "
                     f"(ipyparallel {a.get('ipyparallel', '?')} there)" for r, a in bad.items()]
            raise ClusterError("\n".join(lines) + f"\n{IPP_FIX} on the ranks' Python")
        self.await_cell_channel(deadline)

    def await_cell_channel(self, deadline: float, most: float = 2.0) -> None:
        """Until every rank has said hello on the cell channel; cells to a rank that has not take
        the controller's path (slower, same results), and the log says why."""
        cell_server = self.cell_server()
        if cell_server is None:
            return
        missing = cell_server.wait_connected(self.table.ranks, max(0.0, min(deadline - time.monotonic(), most)))
        if missing:
            errors = self.channel_errors(missing)
            why = "; ".join(f"rank {r}: {errors.get(r) or 'no hello'}" for r in missing)
            log.warning("%s not on the direct cell channel (%s): cells go through the controller",
                        rank_label(missing), why)

    def channel_errors(self, ranks: list[int], timeout: float = 1.0) -> dict[int, str]:
        """Why these ranks are not on the cell channel, as each rank says (best effort, bounded)."""
        from mlx_jupyter.cluster.rank.agent import agent_state

        try:
            futures = {r: self.link.view(r).apply_async(agent_state) for r in ranks}
            wait_any(list(futures.values()), timeout)
            return {r: f.result(0).get("channel_error", "") for r, f in futures.items() if f.done() and not f.exception()}
        except Exception as exc:
            log.debug("could not ask ranks %s about their cell channel: %s", ranks, exc)
            return {}

    def begin_world(self) -> None:
        """Ask every rank to begin forming MLX's world now, in the background (ring only).

        Not waited for: each rank answers once its part of the ring has formed (MLX's
        init holds the rank's GIL meanwhile: see :meth:`forming_world`); the first
        cell's setup takes the world over.
        """
        from mlx_jupyter.cluster.rank.world import start_world_early

        self.world_request = None
        record = backends.find(self.backend)
        if record is None or not record.early_world or self.table.size < 2 or self.link.client is None:
            return
        try:
            self.world_request = self.link.view(self.table.ranks).apply_async(start_world_early)
        except Exception as exc:  # the first cell forms it instead
            log.warning("could not ask the ranks to form MLX's world early: %s", exc)

    def forming_world(self) -> list[int]:
        """The ranks still forming MLX's world begun after start (they answer nothing meanwhile)."""
        ar = self.world_request
        if ar is None:
            return []
        return [r for r, m in zip(self.table.ranks, ar.msg_ids) if self.link.outstanding(m)]

    def wait_world(self, grace: float) -> None:
        """Up to ``grace`` s for the ranks still forming MLX's world (a moment more gives their real state)."""
        ar = self.world_request
        if ar is not None and self.forming_world():
            try:
                ar.wait(grace)
            except Exception:
                pass


def probe_answer(done: Future[Any]) -> dict[str, Any]:
    """The rank agent's state from an answered start probe (see ``agent.require_agent``)."""
    try:
        done.result(0)
        return {"installed": True}
    except Exception as exc:
        try:
            state = json.loads(getattr(exc, "evalue", ""))
            if isinstance(state, dict) and "installed" in state:
                return state
        except ValueError:
            pass
        return {"installed": False, "error": f"the probe failed: {exc}"}
