"""Cluster readiness: until every rank is registered, answers requests, has its agent, and is on the cell channel."""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import FIRST_COMPLETED
from concurrent.futures import wait as wait_any
from typing import Any, Callable, Optional

from mlx_jupyter.cluster.cells.text import rank_label
from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.cluster.shared.ipp_compat import IPP_FIX

ProgressCallback = Callable[[int, int], None]
log = logging.getLogger("mlx_jupyter.cluster")


class Readiness:
    """Part of :class:`~mlx_jupyter.cluster.handle.Cluster`: waiting for the ranks after (re)start."""

    def _wait_for_ranks(self, progress: Optional[ProgressCallback], timeout: float) -> None:
        assert self.client is not None
        deadline = time.monotonic() + timeout
        wanted = set(range(self.size))
        last = -1
        while True:
            ids = set(self.client.ids)
            have = len(ids & wanted)
            if have != last and progress:
                progress(have, self.size)
            last = have
            if ids >= wanted:
                break
            if ids - wanted:
                raise ClusterError(f"engines registered with ids {sorted(ids - wanted)}, not their ranks")
            if self.dead:
                raise ClusterError(self._dead_message("did not start", tail=True))
            if time.monotonic() > deadline:
                missing = sorted(wanted - ids)
                raise ClusterError(
                    f"{rank_label(missing)} not connected after {timeout:g} s\n{self._tail(missing)}"
                )
            self._changed.wait(0.01)
            self._changed.clear()
        self._probe_channels(deadline)
        self._begin_world()

    def _probe_channels(self, deadline: float, patience: float = 0.05, most: float = 0.2) -> None:
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

        client = self.client
        assert client is not None
        pending = set(range(self.size))
        answers: dict[int, dict] = {}
        sent: dict[int, list] = {rank: [] for rank in pending}
        while pending:
            for rank in pending:
                sent[rank].append(client.direct_view(targets=rank).execute(PROBE_CODE, silent=True, block=False))
            until = min(deadline, time.monotonic() + patience)
            patience = min(patience * 2, most)
            while pending and not self.dead:
                for rank in list(pending):
                    done = [f for f in sent[rank] if f.done()]  # an earlier probe may be the one that got through
                    if done:
                        answers[rank] = probe_answer(done[0])
                        pending.discard(rank)
                left = until - time.monotonic()
                if not pending or left <= 0:
                    break
                wait_any([f for r in pending for f in sent[r]], left, FIRST_COMPLETED)
            if self.dead:
                raise ClusterError(self._dead_message("did not start", tail=True))
            if pending and time.monotonic() > deadline:
                raise ClusterError(f"{rank_label(sorted(pending))} registered but never answered a request")
        # probes the controller dropped (sent before the engine's connection was up) never get an
        # answer: they must not count as requests still running, or no cell would take the channel
        self._stray_probes = {m for futures in sent.values() for f in futures if not f.done()
                              for m in getattr(f, "msg_ids", ())}
        bad = {r: a for r, a in sorted(answers.items()) if not a.get("installed")}
        if bad:
            lines = [f"rank {r}: the rank agent (abort, status) is not installed: {a.get('error')} "
                     f"(ipyparallel {a.get('ipyparallel', '?')} there)" for r, a in bad.items()]
            raise ClusterError("\n".join(lines) + f"\n{IPP_FIX} on the ranks' Python")
        self._await_cell_channel(deadline)

    def _await_cell_channel(self, deadline: float, most: float = 2.0) -> None:
        """Until every rank has said hello on the cell channel; cells to a rank that has not take
        the controller's path (slower, same results), and the log says why."""
        if self.hub is None:
            return
        missing = self.hub.wait_connected(self.ranks, max(0.0, min(deadline - time.monotonic(), most)))
        if missing:
            errors = self._channel_errors(missing)
            why = "; ".join(f"rank {r}: {errors.get(r) or 'no hello'}" for r in missing)
            log.warning("%s not on the direct cell channel (%s): cells go through the controller",
                        rank_label(missing), why)

    def _channel_errors(self, ranks: list[int], timeout: float = 1.0) -> dict[int, str]:
        """Why these ranks are not on the cell channel, as each rank says (best effort, bounded)."""
        from mlx_jupyter.cluster.rank.agent import agent_state

        try:
            futures = {r: self.client.direct_view(targets=r).apply_async(agent_state) for r in ranks}
            wait_any(list(futures.values()), timeout)
            return {r: f.result(0).get("channel_error", "") for r, f in futures.items() if f.done() and not f.exception()}
        except Exception as exc:
            log.debug("could not ask ranks %s about their cell channel: %s", ranks, exc)
            return {}

    def _begin_world(self) -> None:
        """Ask every rank to begin forming MLX's world now, in the background (ring only).

        Not waited for: each rank answers once its part of the ring has formed (MLX's
        init holds the rank's GIL meanwhile: see :meth:`forming_world`); the first
        cell's setup takes the world over.
        """
        from mlx_jupyter.cluster.rank.world import start_world_early

        self._world_ar = None
        if self.backend != "ring" or self.size < 2 or self.client is None:
            return
        try:
            self._world_ar = self.client.direct_view(targets=self.ranks).apply_async(start_world_early)
        except Exception as exc:  # the first cell forms it instead
            log.warning("could not ask the ranks to form MLX's world early: %s", exc)

    def forming_world(self) -> list[int]:
        """The ranks still forming MLX's world begun after start (they answer nothing meanwhile)."""
        ar, client = self._world_ar, self.client
        if ar is None or client is None:
            return []
        return [r for r, m in zip(self.ranks, getattr(ar, "msg_ids", [])) if m in client.outstanding]


def probe_answer(done: Any) -> dict:
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
