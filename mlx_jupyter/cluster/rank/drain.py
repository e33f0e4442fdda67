"""A drain on a rank (issue 42): the MLX collectives a blocked peer waits in, made here with neutral
data, so that the peer's op completes and MLX's world stays usable.

The notebook asks every rank of a stopped run for its :func:`pending_state`, plans
(:mod:`mlx_jupyter.where.drain_plan`), has each rank that is behind :func:`make` the missing calls,
and tells a frozen rank's :class:`Gate` the verdict when no drain is possible (its sockets are then
closed as before). A frozen rank whose op completes raises its pending KeyboardInterrupt at the next
bytecode: no user code runs on a drained result.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Callable, Optional, Sequence

from mlx_jupyter.where import mlx_calls

#: the longest a frozen rank waits for the notebook's drain or verdict before closing MLX's sockets itself
#: (counted from the notebook's last question: it asks while it drains)
HOLD = 1.3
#: the longest a frozen rank is held in all, however long the notebook asks: past the notebook's longest wait
#: for ranks that finish an evaluation together (mlx_jupyter.cluster.drain.BUSY_MOST)
HOLD_MOST = 150.0
#: the longest a drain's calls may take here before the rank says it did not finish
MAKE_TIMEOUT = 0.5


def _status() -> Optional[Callable[[Any], int]]:
    """The bridge's ``status(array)`` (0 never scheduled, 1 scheduled, 2 ran), None without the bridge."""
    try:
        from mlx_jupyter import _mlx_bridge

        return getattr(_mlx_bridge, "status", None)
    except Exception:
        return None


def statuses(record: Any) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Per key (a group's label, or a send/recv pair's ``label:src>dst``), the newest calls this rank made
    but never evaluated (status 0: never scheduled on its stream, so never run), and those scheduled but
    not finished (status 1: its stream is in them, or waits to be); the others ran. Without the bridge: none known."""
    status = _status()
    unrun: dict[str, list[int]] = {}
    inflight: dict[str, list[int]] = {}
    if status is None:
        return unrun, inflight
    for key, seq, _op, _x, _peer, _code, _lasti, _via, held in list(record.calls):
        arr = held() if isinstance(held, weakref.ref) else held
        if arr is None:
            continue
        state = status(arr)
        if state < 2:
            (unrun if state == 0 else inflight).setdefault(key, []).append(seq)
    return unrun, inflight


def pending_state(executing: bool, frozen: bool) -> dict[str, Any]:
    """What a drain's plan reads of this rank (any thread): its collectives and whether it is stuck."""
    record = mlx_calls.RECORD
    state: dict[str, Any] = {"executing": executing, "frozen": frozen, "made": {}, "unrun": {}, "calls": [],
                             "groups": {}}
    if record is None:
        return state
    never, inflight = statuses(record)
    state.update(made=record.counts, unrun=never, inflight=inflight,
                 groups={k: list(v) for k, v in record.groups.items()})
    calls = []
    for key, seq, op, x, *_ in list(record.calls):
        dtype, shape = x if isinstance(x, tuple) else (x.dtype, x.shape)
        calls.append([key, seq, op, str(dtype).replace("mlx.core.", ""), list(shape or ())])
    state["calls"] = calls
    return state


def _group(record: Any, label: str) -> Any:
    """The group a label names on this rank (None: MLX's global group)."""
    for group, name in list(record.labels.values()):
        if name == label:
            return group
    if label == mlx_calls.WORLD:
        return None
    raise LookupError(f"no group `{label}` on this rank")


def make(calls: Sequence[Sequence[Any]], on_main: Callable[[Callable[[], None]], None],
         still_this_run: Callable[[], bool], timeout: float = MAKE_TIMEOUT) -> dict[str, Any]:
    """Make ``calls`` ([label, seq, op, dtype, shape], in order) with zeros, on the rank's main thread
    (``on_main`` runs a function there): MLX's default streams are per thread, and the rank's own calls
    ran on the main thread's. ``done`` says whether all completed within ``timeout`` s."""
    import mlx.core as mx

    record = mlx_calls.RECORD
    result: dict[str, Any] = {"done": False, "error": "", "made": 0}
    if record is None:
        result["error"] = "MLX's collectives are not recorded on this rank"
        return result
    finished = threading.Event()

    def run() -> None:
        try:
            if not still_this_run():   # checked on the main thread: no request can begin meanwhile
                result["error"] = "it began another request since"
                return
            for label, seq, op, dtype, shape in calls:
                mx.eval(_made(mx, record, str(label), str(op), str(dtype), tuple(shape)))
                result["made"] += 1
            result["done"] = True
        except Exception as exc:  # a peer gone meanwhile: the notebook falls back to the shutdown
            result["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            finished.set()

    began = time.monotonic()
    on_main(run)
    if not finished.wait(timeout):  # a call left waiting would pair with the next cell's: the caller closes the world
        result.update(error=f"its calls did not complete within {timeout:g} s", stuck=True)
    result["took"] = time.monotonic() - began
    return result


def _made(mx: Any, record: Any, key: str, op: str, dtype: str, shape: tuple[int, ...]) -> Any:
    """One drain call, with zeros, through MLX's own function (the drain is not the user's call): a
    collective on group ``key``, or the send/recv of pair ``label:src>dst``."""
    fn = getattr(mx.distributed, op)
    fn = getattr(fn, "__wrapped__", fn)
    label, _, pair = key.partition(":")
    group = _group(record, label)
    if op == "send":
        return fn(mx.zeros(shape, dtype=getattr(mx, dtype)), int(pair.split(">")[1]), group=group)
    if op == "recv":
        return fn(shape, getattr(mx, dtype), int(pair.split(">")[0]), group=group)
    return fn(mx.zeros(shape, dtype=getattr(mx, dtype)), group=group)


class Gate:
    """Where a frozen cell waits for the notebook's drain or its verdict (see :meth:`hold`)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.frozen = 0  # the cell found frozen in native code
        self.verdicts: dict[int, str] = {}
        self.asked_at = 0.0  # time.monotonic() the notebook last asked this rank's state (it still drains)

    def hold(self, cell: int, running: Callable[[], bool], wait: float = HOLD) -> Optional[str]:
        """Cell ``cell`` is frozen: wait until it ends (None: drained) or a verdict comes (the reason to
        close MLX's sockets), at most ``wait`` s after the notebook last asked this rank's state (it drains
        in rounds, and waits for ranks that evaluate together), and at most :data:`HOLD_MOST` s in all."""
        began = time.monotonic()
        with self.cond:
            self.frozen = cell
            while running() and cell not in self.verdicts:
                now = time.monotonic()
                end = min(max(began, self.asked_at) + wait, began + HOLD_MOST)
                if now >= end:
                    return f"no drain came within {now - began:.3g} s"
                self.cond.wait(min(end - now, 0.02))   # a cell's end does not notify: its state is polled
            return self.verdicts.pop(cell, None) if running() else None

    def is_frozen(self, cell: int) -> bool:
        return self.frozen == cell

    def verdict(self, cell: int, reason: str) -> None:
        """No drain for ``cell``: its hold ends, and MLX's sockets are closed for ``reason``."""
        with self.cond:
            self.verdicts[cell] = reason
            self.cond.notify_all()


def handlers(agent: Any) -> dict[str, Callable[[Any, Any, dict[str, Any]], None]]:
    """The control-channel requests of a drain, answered by ``agent`` (a :class:`~.agent.RankAgent`)."""

    def ran_it(parent: dict[str, Any]) -> bool:
        """Whether the request the drain names is this rank's current (or last) one: none began since."""
        return bool(parent["content"].get("msg_id")) and parent["content"]["msg_id"] == agent.msg_id

    def this_run(parent: dict[str, Any]) -> bool:
        """:func:`ran_it`, or the request was aborted here before it began, and none began since (a peer
        raised at once: this rank's abort came first, so its peers wait in calls it never got to make)."""
        return ran_it(parent) or agent.never_began(str(parent["content"].get("msg_id") or ""))

    def on_state(stream: Any, idents: Any, parent: dict[str, Any]) -> None:
        executing, cell = agent.executing, agent.cell
        agent.gate.asked_at = time.monotonic()
        state = pending_state(executing, executing and agent.gate.is_frozen(cell))
        state["this_run"] = this_run(parent)
        agent._reply(stream, idents, parent, "mlx_drain_state_reply", state)

    def on_make(stream: Any, idents: Any, parent: dict[str, Any]) -> None:
        # only a rank whose cell of that run ended makes anything, and before any other request begins
        refused = ("it still runs a cell" if agent.executing else
                   "" if this_run(parent) else "it began another request since")
        made = ({"done": False, "error": f"rank {agent.rank}: {refused}", "made": 0} if refused
                else make(parent["content"].get("calls") or [], agent.kernel.io_loop.add_callback,
                          lambda: not agent.executing and this_run(parent)))
        if made.get("stuck"):
            agent.close_world(f"a drain's call was left waiting ({made['error']})")
        agent._reply(stream, idents, parent, "mlx_drain_reply", made)

    def on_verdict(stream: Any, idents: Any, parent: dict[str, Any]) -> None:
        reason = str(parent["content"].get("reason") or "no drain")
        if agent.executing and this_run(parent):
            agent.gate.verdict(agent.cell, reason)
        elif ran_it(parent) and not agent.world_closed:
            # its cell ended, but its stream still waits in a call that cannot be drained: the next cell's
            # call would pair with it
            agent.close_world(f"the stopped cell left an MLX call waiting on its stream; not drained: {reason}")
        agent._reply(stream, idents, parent, "mlx_drain_verdict_reply", {})

    def on_stop_pause(stream: Any, idents: Any, parent: dict[str, Any]) -> None:
        # the next call waits for the agreed number: the calls made, read after this, are all there will be
        record = mlx_calls.RECORD
        made: dict[str, int] = {}
        if record is not None and agent.executing and this_run(parent):
            record.stop_known.clear()
            record.stop_after = {}
            made = record.counts
        agent._reply(stream, idents, parent, "mlx_stop_pause_reply", {"paused": bool(made), "made": made})

    def on_stop_after(stream: Any, idents: Any, parent: dict[str, Any]) -> None:
        record = mlx_calls.RECORD
        if record is not None and record.stop_after is not None and this_run(parent):
            record.stop_after = {str(k): int(v) for k, v in (parent["content"].get("after") or {}).items()}
            record.stop_known.set()
        agent._reply(stream, idents, parent, "mlx_stop_after_reply", {})

    return {"mlx_drain_state_request": on_state, "mlx_drain_request": on_make,
            "mlx_drain_verdict_request": on_verdict, "mlx_stop_pause_request": on_stop_pause,
            "mlx_stop_after_request": on_stop_after}
