"""The notebook's end of the direct cell channel (see :mod:`mlx_jupyter.cluster.rank.channel`).

One ROUTER socket, bound beside the controller before the ranks start; each
rank connects to it and says hello. :meth:`CellHub.send_cell` sends a cell to
a rank; what comes back (outputs, then the reply) is handed to the cell's sink
(a :class:`~mlx_jupyter.cluster.cells.run.CellRun`) on the hub's own thread, the only
one that touches the socket.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Optional, Protocol

import zmq

from mlx_jupyter.cluster.cells import wire
from mlx_jupyter.cluster.cells.socketthread import SocketThread, received

log = logging.getLogger("mlx_jupyter.cluster.cells.hub")


class Sink(Protocol):
    def channel_output(self, rank: int, kind: str, content: dict) -> None: ...
    def channel_reply(self, rank: int, content: dict) -> None: ...


class Pending:
    """A cell sent on the channel whose reply has not come: ``done()`` once it has (or its rank is gone)."""

    def __init__(self, rank: int, sink: Sink):
        self.rank = rank
        self.sink = sink
        self._done = threading.Event()

    def done(self) -> bool:
        return self._done.is_set()


class CellHub:
    """Binds on ``ip`` (a random port: :attr:`port`); :meth:`start` once the cluster's session is known."""

    def __init__(self, ip: str = "127.0.0.1"):
        self.socket = zmq.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.RCVHWM, 0)  # the ranks' output bursts queue here, never dropped
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a rank not connected fails, never vanishes
        self.port = self.socket.bind_to_random_port(f"tcp://{ip}")
        self.session: Any = None
        self.idents: dict[int, bytes] = {}  # rank -> its socket identity, from its hello
        self.pids: dict[int, int] = {}
        self.pending: dict[str, Pending] = {}
        self._lock = threading.Lock()
        self._hello = threading.Condition(self._lock)
        self._out: collections.deque = collections.deque()
        self._io = SocketThread(self.socket, "mlx-cell-hub", self._receive, self._send_queued)
        self.dropped = 0  # messages that failed to decode (bad signature, ...)

    def start(self, session: Any) -> "CellHub":
        """Begin reading, verifying with ``session``'s key (what the ranks sent meanwhile waits in the socket)."""
        self.session = session
        self._io.start()
        return self

    # ------------------------------------------------------------ ranks

    def connected(self, ranks: list[int]) -> bool:
        with self._lock:
            return all(r in self.idents for r in ranks)

    def wait_connected(self, ranks: list[int], timeout: float) -> list[int]:
        """Until every rank of ``ranks`` said hello, or ``timeout`` s; the ranks still missing."""
        with self._hello:
            self._hello.wait_for(lambda: all(r in self.idents for r in ranks), timeout)
            return [r for r in ranks if r not in self.idents]

    def forget(self, ranks: Optional[list[int]] = None) -> None:
        """Ranks gone (died, restarting): until they say hello again cells take the controller's path;
        their cells still waiting for a reply are done."""
        with self._lock:
            gone = set(self.idents if ranks is None else ranks)
            for r in gone:
                self.idents.pop(r, None)
                self.pids.pop(r, None)
            for msg_id, p in list(self.pending.items()):
                if p.rank in gone:
                    del self.pending[msg_id]
                    p._done.set()

    # ------------------------------------------------------------ cells (any thread)

    def send_cell(self, rank: int, msg_id: str, code: str, sink: Sink) -> Pending:
        return self.send_cells({rank: msg_id}, code, sink)[rank]

    def send_cells(self, msg_ids: dict[int, str], code: str, sink: Sink) -> dict[int, Pending]:
        """Send ``code`` to each rank of ``msg_ids`` (rank -> its message id), waking the
        socket's thread once for all of them."""
        pending: dict[int, Pending] = {}
        unreachable = []
        with self._lock:
            for rank, msg_id in msg_ids.items():
                ident = self.idents.get(rank)
                pending[rank] = self.pending[msg_id] = Pending(rank, sink)
                if ident is None:
                    unreachable.append((msg_id, rank))
                else:
                    self._out.append((ident, msg_id, rank, {"t": "cell", "id": msg_id, "code": code}))
        if len(unreachable) < len(msg_ids):
            self._io.wake()
        for msg_id, rank in unreachable:
            self._unreachable(msg_id, rank)
        return pending

    def _unreachable(self, msg_id: str, rank: int) -> None:
        self._deliver_reply(msg_id, {
            "status": "error", "ename": "ChannelError",
            "evalue": f"rank {rank} is not connected to the notebook's cell channel (did it restart?); run the cell again",
            "traceback": []})

    # ------------------------------------------------------------ the hub's thread

    def _send_queued(self) -> None:
        while self._out:
            ident, msg_id, rank, obj = self._out.popleft()
            try:
                self.socket.send_multipart([ident] + wire.encode(self.session, obj))
            except zmq.ZMQError:  # EHOSTUNREACH: that rank's connection is gone
                self._unreachable(msg_id, rank)

    def _receive(self) -> None:
        for frames in received(self.socket):
            try:
                msg = wire.decode(self.session, frames[1:])
            except wire.WireError as exc:
                self.dropped += 1
                log.warning("cell channel: dropped a message: %s", exc)
                continue
            try:
                self._handle(frames[0], msg)
            except Exception:  # a bug; keep the thread alive
                log.exception("cell channel: handling %s failed", msg.get("t"))

    def _handle(self, ident: bytes, msg: dict) -> None:
        kind = msg["t"]
        if kind == "hello":
            with self._hello:
                self.idents[int(msg["rank"])] = bytes(ident)
                self.pids[int(msg["rank"])] = int(msg.get("pid", 0))
                self._hello.notify_all()
        elif kind == "out":
            with self._lock:
                p = self.pending.get(str(msg.get("id")))
            if p is not None:
                p.sink.channel_output(p.rank, str(msg.get("kind")), msg.get("content") or {})
        elif kind == "reply":
            self._deliver_reply(str(msg.get("id")), msg.get("content") or {})

    def _deliver_reply(self, msg_id: str, content: dict) -> None:
        """The cell's reply to its sink, once (a cell no longer pending is ignored)."""
        with self._lock:
            p = self.pending.pop(msg_id, None)
        if p is None:
            return
        p._done.set()
        p.sink.channel_reply(p.rank, content)

    def close(self) -> None:
        self._io.close()
