"""A drain after a cell run's abort (issue 42): the ranks that stopped make the MLX collectives their
blocked peers wait in, with neutral data, so that MLX's world outlives the error or the stop button.

:meth:`Drainer.start` runs beside the abort: it asks the run's ranks their pending state on the control
channel until every rank still running is frozen in native code, plans (:mod:`mlx_jupyter.where.drain_plan`)
and has each rank that is behind make its calls (:mod:`mlx_jupyter.cluster.rank.drain`); when no drain
is possible it tells the frozen ranks why, and they close MLX's sockets as before, naming that reason.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Mapping, Optional, Sequence

from mlx_jupyter.cluster.controller_link import ControllerLink
from mlx_jupyter.cluster.rank_table import RankTable
from mlx_jupyter.cluster.shared.errors import ClusterError
from mlx_jupyter.vocab import backends
from mlx_jupyter.where import drain_plan

log = logging.getLogger("mlx_jupyter.cluster.drain")

#: how long the drain waits for the stopped ranks' Python to end and the others to freeze
SETTLE = 1.0
#: how long the drain waits for stopped ranks that still run Python (an interrupted rank's traceback takes
#: a second to format on a loaded machine, and its stream may still run calls a peer waits in)
PYTHON_WAIT = 5.0
#: how long one rank may take to make its calls (the rank's own limit is 0.5 s)
MAKE = 0.7
#: the most drain rounds of one run (each makes the calls its blocked ranks wait in at that moment)
ROUNDS = 8
#: how long blocked ranks whose calls every rank made are waited for when a rank of the run has left it (what
#: they wait in is native code the record does not show; MLX's ring spins while it waits, so CPU time does not
#: tell computing from waiting)
BUSY_WAIT = 3.0
#: how long ranks that are all still in one evaluation every rank joined are waited for (a long prefill: it ends
#: by itself, as it would have without the stop; MLX cannot cancel it). A second stop ends the wait at once.
BUSY_MOST = 120.0

#: told the ranks that still evaluate after a stop, or that a drain just released (their release may take
#: longer), and whether they are all finishing one evaluation together (the user is told once)
OnBusy = Callable[[list[int], bool], None]


class Drainer:
    """Drains the MLX collectives of stopped runs on ``table``'s ranks through ``link``'s control channel."""

    def __init__(self, link: ControllerLink, table: RankTable, backend: str) -> None:
        self.link, self.table = link, table
        record = backends.find(backend)
        self.ops: tuple[str, ...] = record.drain_ops if record is not None else ()
        self.last = ""  # what the last drain did, in words (for the tests and the debug log)
        self.thread: Optional[threading.Thread] = None  # the last drain's
        self.insisted = threading.Event()  # the user stopped again: wait for no evaluation to finish

    def start(self, ranks: Sequence[int], msg_ids: Mapping[int, str], on_busy: Optional[OnBusy] = None) -> threading.Thread:
        """Drain a run over ``ranks`` (``msg_ids``: its request on each) whose abort was just sent, on a
        thread of its own."""
        self.insisted.clear()
        thread = threading.Thread(target=self._run, args=(list(ranks), dict(msg_ids), on_busy), name="mlx-drain",
                                  daemon=True)
        thread.start()
        self.thread = thread
        return thread

    def _run(self, ranks: list[int], msg_ids: dict[int, str], on_busy: Optional[OnBusy]) -> None:
        try:
            self.last = self.drain(ranks, msg_ids, on_busy)
        except ClusterError as exc:   # the cluster stopped meanwhile: nothing is left to drain
            self.last = f"stopped: {exc}"
        except Exception as exc:  # pragma: no cover - a bug: the ranks' own hold still ends in the shutdown
            log.exception("drain failed")
            self.last = f"failed: {exc}"
        log.debug("drain: %s", self.last)

    def drain(self, ranks: list[int], msg_ids: dict[int, str], on_busy: Optional[OnBusy] = None) -> str:
        """Drain the run in rounds (:meth:`drain_once`): a rank released by one round may meet the next call its
        evaluation holds (mlx-lm schedules the next token while one runs); what happened, in words."""
        said: list[str] = []
        drained: dict[int, list[drain_plan.Call]] = {}   # the calls earlier rounds made (not in the ranks' records)
        for _ in range(ROUNDS):
            text = self.drain_once(ranks, msg_ids, on_busy, drained)
            if not said or text.startswith(("drained", "not drained")):
                said.append(text)
            if not text.startswith("drained"):
                break
            if on_busy is not None:   # released: give them the time to end, or to block in the next call
                on_busy(ranks, False)
        return "; then ".join(said)

    def drain_once(self, ranks: list[int], msg_ids: dict[int, str], on_busy: Optional[OnBusy] = None,
                   drained: Optional[dict[int, list[drain_plan.Call]]] = None) -> str:
        """Plan and run the drain of the run whose request on each rank is ``msg_ids``; what happened, in words.

        Every request names the run's request on its rank: a rank that has begun another one since
        (the run ended meanwhile) answers for nothing, makes nothing and holds nothing. Ranks that all
        joined the collectives they evaluate are waited for (MLX cannot cancel an evaluation): up to
        :data:`BUSY_MOST` s while every rank of the run is still in it, until :attr:`insisted`; else up to
        :data:`BUSY_WAIT` s. ``on_busy`` is told which: at every look while they evaluate together, else once."""
        began = time.monotonic()
        end = began + SETTLE
        told = False   # on_busy was told
        while True:
            states = self._ask(ranks, msg_ids, max(0.05, end - time.monotonic()))
            if log.isEnabledFor(logging.DEBUG):
                log.debug("states at %.3f s: %s", time.monotonic() - began,
                          {r: (st.get("executing"), st.get("frozen"), st.get("made"), st.get("unrun"),
                               st.get("inflight"))
                           for r, st in states.items()})
            if any(not st.get("this_run") for st in states.values()):
                return "the run is over"
            plan = drain_plan.plan(drain_plan.with_drained(states, drained or {}), ranks, self.table.dead, self.ops)
            now = time.monotonic()
            if plan.busy:
                together = set(plan.frozen) >= set(states)   # no rank of the run has left it
                if together and self.insisted.is_set():
                    why = (f"stopped again while {drain_plan.rank_words(plan.frozen)} finished an MLX evaluation every "
                           "rank joined (MLX cannot cancel one)")
                    self._verdict(plan.frozen, why, msg_ids)
                    return f"not drained: {why}"
                end = max(end, began + (BUSY_MOST if together else BUSY_WAIT))
                # ranks evaluating together are not late while they do; others' release is waited for once
                if on_busy is not None and (together or not told):
                    on_busy(plan.frozen, together)
                told = True
            if plan.wait and not plan.why and not plan.busy:   # a rank still runs Python: it ends soon
                end = max(end, min(now + SETTLE, began + PYTHON_WAIT))
            if not plan.wait or now > end:
                break
            # polling: a Python rank's KeyboardInterrupt ends it within ms; ranks still evaluating, less often
            time.sleep(0.1 if plan.busy and now - began > SETTLE else 0.02)
        if plan.wait and plan.why:   # they did not finish by themselves meanwhile
            self._verdict(plan.frozen, plan.why, msg_ids)
            return f"not drained: {plan.why}"
        if plan.wait or not plan.frozen:
            log.debug("nothing drained; the states were %s", states)
            return "nothing to drain" if not plan.wait else "a rank still runs Python"
        if plan.why:
            self._verdict(plan.frozen, plan.why, msg_ids)
            return f"not drained: {plan.why}"
        futures = {r: self._send(r, "mlx_drain_request",
                                             {"calls": [list(c) for c in calls], "msg_id": msg_ids.get(r, "")})
                   for r, calls in plan.calls.items()}
        failed = []
        deadline = time.monotonic() + MAKE
        for rank, fut in futures.items():
            reply = _content(fut, max(0.0, deadline - time.monotonic()))
            if reply is None or not reply.get("done"):
                why = (reply or {}).get("error") or "no answer"
                log.debug("rank %d's drain: %s", rank, reply)
                failed.append(f"rank {rank}'s drain failed ({why})")
        if failed:
            log.debug("drain failed; the states were %s", states)
            self._verdict(plan.frozen, "; ".join(failed), msg_ids)
            return "not drained: " + "; ".join(failed)
        if drained is not None:
            for rank, calls in plan.calls.items():
                drained.setdefault(rank, []).extend(calls)
        return "drained: " + drain_plan.describe(plan.calls)

    def agreed_stop(self, ranks: Sequence[int], msg_ids: Mapping[int, str], timeout: float = 1.0) -> dict[str, int]:
        """Pause the run's ranks at their next MLX call, gather the calls each made, and tell them the last
        any made, per group: each stops (KeyboardInterrupt) before its first call past it, so every rank
        stops at the same call. {} when no rank made any (plain Python) or one did not answer: the
        caller then interrupts as before."""
        futures = {r: self._send(r, "mlx_stop_pause_request", {"msg_id": msg_ids.get(r, "")}) for r in ranks}
        deadline = time.monotonic() + timeout
        replies = [_content(f, max(0.0, deadline - time.monotonic())) for f in futures.values()]
        made = [{str(k): int(v) for k, v in (rep.get("made") or {}).items() if ":" not in str(k)}
                for rep in replies if rep and rep.get("paused")]
        after = {k: max(m.get(k, 0) for m in made) for k in {k for m in made for k in m}}
        for rank in ranks:   # always: a paused rank waits for its number
            self._send(rank, "mlx_stop_after_request", {"after": after, "msg_id": msg_ids.get(rank, "")})
        return after if len(made) == len(ranks) and any(after.values()) else {}

    def _ask(self, ranks: Sequence[int], msg_ids: dict[int, str], timeout: float) -> dict[int, Any]:
        """Each live rank's pending state for the run (:func:`mlx_jupyter.cluster.rank.drain.pending_state`)."""
        ids = self.link.ids()
        futures = {r: self._send(r, "mlx_drain_state_request", {"msg_id": msg_ids.get(r, "")})
                   for r in ranks if r not in self.table.dead and r in ids}
        deadline = time.monotonic() + timeout
        out = {}
        for rank, fut in futures.items():
            reply = _content(fut, max(0.0, deadline - time.monotonic()))
            if reply is not None:
                out[rank] = reply
        return out

    def _send(self, rank: int, msg_type: str, content: dict[str, Any]) -> Any:
        self.link.need()   # ClusterError once the cluster is stopped
        return self.link.send_control(rank, msg_type, content)

    def _verdict(self, frozen: Sequence[int], why: str, msg_ids: dict[int, str]) -> None:
        """No drain: the frozen ranks close MLX's sockets now, for ``why``."""
        for rank in frozen:
            self._send(rank, "mlx_drain_verdict_request", {"reason": why, "msg_id": msg_ids.get(rank, "")})


def _content(fut: Any, timeout: float) -> Optional[dict[str, Any]]:
    try:
        return dict(fut.result(timeout)["content"])
    except Exception:
        return None
