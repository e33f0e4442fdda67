"""The notebook's end of the direct cell channel (see :mod:`mlx_jupyter.cluster.rank.channel`).

A TCP listener, bound beside the controller before the ranks start; each rank
connects to it and says hello. :meth:`CellServer.send_cells` writes a cell to
its ranks' connections from the calling thread; what comes back (outputs,
then the reply) is read by the cell server's own thread and handed to the cell's sink
(a :class:`~mlx_jupyter.cluster.cells.run.CellRun`), or, while the thread that
shows the cell waits for it, by that thread itself (:meth:`CellServer.pump`): a
reply then wakes only the thread that needs it, not the server's thread and then
that one (on a loaded machine each wake-up is a scheduling delay).

The port is open to anyone who can reach it, so a connection that sends
anything not signed with the cluster's key is closed, one that has not said
hello within :data:`HELLO_TIMEOUT` s is closed, and at most :data:`MAX_UNKNOWN`
connections wait for their hello at once (the oldest goes first).
"""

from __future__ import annotations

import logging
import os
import select
import selectors
import socket
import threading
import time
from typing import Any, Callable, Optional, Protocol

from mlx_jupyter.cluster.shared import wire
from mlx_jupyter.cluster.shared.transport import Writer, read_available, tune

log = logging.getLogger("mlx_jupyter.cluster.cells.cell_server")

#: seconds a new connection has to say hello (signed) before it is closed
HELLO_TIMEOUT = 5.0
#: connections without a hello kept at once
MAX_UNKNOWN = 64
#: the largest message a connection may send before its hello
MAX_HELLO = 1 << 16
#: seconds a cell whose rank's connection broke waits for that rank's fate (its death, reported by
#: the cluster) before it ends with a ChannelError
LOST_GRACE = 3.0


class Sink(Protocol):
    def channel_output(self, rank: int, kind: str, content: dict[str, Any]) -> None: ...
    def channel_reply(self, rank: int, content: dict[str, Any]) -> None: ...
    def channel_debug(self, rank: int, text: str, prompt: Optional[str], done: bool) -> None: ...


class Pending:
    """A cell sent on the channel whose reply has not come: ``done()`` once it has (or its rank is gone)."""

    def __init__(self, rank: int, sink: Sink):
        self.rank = rank
        self.sink = sink
        self._done = threading.Event()

    def done(self) -> bool:
        return self._done.is_set()


class Connection:
    """One rank's connection (or a stranger's, until it says hello)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.writer = Writer(sock)
        self.reader = wire.FrameReader(MAX_HELLO)
        self.opened = time.monotonic()
        self.rank: Optional[int] = None


class CellServer:
    """Listens on ``ip`` (a free port: :attr:`port`); :meth:`start` once the cluster's session is known."""

    def __init__(self, ip: str = "127.0.0.1"):
        """``ip``: an address of this host, or ``*`` for all of them."""
        if ip in ("*", ""):
            dual = socket.has_dualstack_ipv6()
            self.listener = socket.create_server(("", 0), family=socket.AF_INET6 if dual else socket.AF_INET,
                                                 backlog=128, dualstack_ipv6=dual)
        else:
            family = socket.AF_INET6 if ":" in ip else socket.AF_INET
            self.listener = socket.create_server((ip.strip("[]"), 0), family=family, backlog=128)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.session: Any = None
        self.idents: dict[int, Connection] = {}  # rank -> its connection, from its hello
        self.pids: dict[int, int] = {}
        self.pending: dict[str, Pending] = {}
        self.dropped = 0  # connections closed for sending what did not decode (bad signature, ...)
        self._lock = threading.Lock()
        self._hello = threading.Condition(self._lock)
        self._conns: dict[socket.socket, Connection] = {}  # every open connection (the server's thread only)
        self._lost: dict[str, float] = {}  # msg_id -> when its rank's connection broke (the server's thread only)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._closed = False
        self._thread: Optional[threading.Thread] = None
        #: held by whichever thread reads the ranks' connections: the cell server's, or a cell's reader (pump)
        self._reading = threading.Lock()
        self._turn = threading.Condition()  # a reader lets the server's thread take its waiting turn first
        self._server_waiting = False

    def start(self, session: Any) -> "CellServer":
        """Begin accepting and reading, verifying with ``session``'s key (connections made
        meanwhile wait in the listener's backlog)."""
        self.session = session
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="mlx-cell-server", daemon=True)
            self._thread.start()
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
            ended = [p for p in self.pending.values() if p.rank in gone]
            self.pending = {k: p for k, p in self.pending.items() if p.rank not in gone}
        for p in ended:
            p._done.set()

    # ------------------------------------------------------------ cells (any thread)

    def send_cell(self, rank: int, msg_id: str, code: str, sink: Sink) -> Pending:
        return self.send_cells({rank: msg_id}, code, sink)[rank]

    def send_cells(self, msg_ids: dict[int, str], code: str, sink: Sink, first_line: int = 1) -> dict[int, Pending]:
        """Write ``code`` to each rank of ``msg_ids`` (rank -> its message id), from this thread;
        ``first_line``: the number of its first line in the rank's tracebacks (2 under the magic's line)."""
        pending: dict[int, Pending] = {}
        targets = []
        with self._lock:
            for rank, msg_id in msg_ids.items():
                pending[rank] = self.pending[msg_id] = Pending(rank, sink)  # before a reply can come
                targets.append((rank, msg_id, self.idents.get(rank)))
        count = notebook_count()
        framed = [(rank, msg_id, conn, wire.frame(wire.encode(self.session, {
            "t": "cell", "id": msg_id, "code": code, **({"count": count} if count else {}),
            **({"first": first_line} if first_line > 1 else {})})))
            for rank, msg_id, conn in targets]
        for rank, msg_id, conn, data in framed:  # back to back: no other thread runs between them
            if conn is None or not conn.writer.send_small(data):
                self._unreachable(msg_id, rank)
        return pending

    def send_call(self, rank: int, msg_id: str, fn: str, args: list[Any], sink: Sink) -> Pending:
        """Ask ``rank`` to run the product's function ``fn`` (``module:function``, one that
        :mod:`mlx_jupyter.cluster.rank.calls` allows) with ``args``; its answer comes as the reply."""
        with self._lock:
            pending = self.pending[msg_id] = Pending(rank, sink)
            conn = self.idents.get(rank)
        data = wire.frame(wire.encode(self.session, {"t": "call", "id": msg_id, "fn": fn, "args": args}))
        if conn is None or not conn.writer.send(data):
            self._unreachable(msg_id, rank)
        return pending

    def send_debug_line(self, rank: int, line: Optional[str]) -> bool:
        """Answer ``rank``'s debug prompt with ``line`` (None: the notebook cannot prompt)."""
        with self._lock:
            conn = self.idents.get(rank)
        data = wire.frame(wire.encode(self.session, {"t": "dbg_in", "line": line}))
        return conn is not None and conn.writer.send(data)

    def _unreachable(self, msg_id: str, rank: int) -> None:
        self._deliver_reply(msg_id, {
            "status": "error", "ename": "ChannelError",
            "evalue": f"rank {rank} is not connected to the notebook's cell channel (did it restart?); run the cell again",
            "traceback": []})

    # ------------------------------------------------------------ the server's thread

    def _loop(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._closed:
                for key, _ in selector.select(timeout=1.0 if self._unknown() or self._lost else None):
                    if key.fileobj is self.listener:
                        self._accept(selector)
                    elif key.fileobj == self._wake_r:
                        try:
                            os.read(self._wake_r, 4096)
                        except OSError:
                            pass
                    else:
                        if not _has_input(key.fileobj):  # type: ignore[arg-type]
                            continue  # a cell's reader took it first (pump): no turn needed
                        with self._turn:
                            self._server_waiting = True
                        with self._reading:
                            with self._turn:
                                self._server_waiting = False
                                self._turn.notify_all()
                            conn = self._conns.get(key.fileobj)  # type: ignore[call-overload]
                            if conn is not None:
                                self._read(selector, conn)
                self._expire(selector)
                self._end_lost()
        except Exception:  # a bug; say so rather than die silently
            log.exception("cell channel: the server's thread failed")
        finally:
            with self._reading:  # not under a reader's poll
                for conn in list(self._conns.values()):
                    self._drop(selector, conn)
            selector.close()
            self.listener.close()
            os.close(self._wake_r)

    def _unknown(self) -> list[Connection]:
        return [c for c in self._conns.values() if c.rank is None]

    def _accept(self, selector: selectors.BaseSelector) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: the backlog waits
                log.warning("cell channel: accept failed: %s", exc)
                return
            conn = Connection(tune(sock))
            self._conns[sock] = conn
            selector.register(sock, selectors.EVENT_READ)
            unknown = self._unknown()
            if len(unknown) > MAX_UNKNOWN:
                self._drop(selector, min(unknown, key=lambda c: c.opened))

    def _expire(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        for conn in self._unknown():
            if now - conn.opened > HELLO_TIMEOUT:
                self._drop(selector, conn)

    def _read(self, selector: selectors.BaseSelector, conn: Connection) -> None:
        data = read_available(conn.sock)
        if data is None:
            self._drop(selector, conn)
            return
        if not self._consume(conn, data):
            self._drop(selector, conn)

    def _consume(self, conn: Connection, data: bytes) -> bool:
        """Handle the messages ``data`` completes (under ``_reading``); False if it did not decode."""
        try:
            for frames in conn.reader.feed(data):
                msg = wire.decode(self.session, frames)
                try:
                    self._handle(conn, msg)
                except Exception:  # a bug; keep the thread alive
                    log.exception("cell channel: handling %s failed", msg.get("t"))
        except wire.WireError as exc:
            self.dropped += 1
            log.warning("cell channel: closed a connection that sent %s", exc)
            return False
        return True

    def pump(self, ranks: list[int], timeout: float, idle: Optional[Callable[[], bool]] = None) -> bool:
        """Read and handle what ``ranks``' connections send, from the calling thread: waits at most
        ``timeout`` s for something to come (not at all if ``idle()`` is False once the read turn is
        taken: e.g. its events came meanwhile). False if it could not wait on them (one ended, all
        are gone, or the cell server closed): the caller waits its own way. A closed or undecodable connection is left to
        the server's thread, which drops it; so is everything else (new connections, other ranks)."""
        with self._turn:  # the server's thread has other connections to read too: never starve it
            self._turn.wait_for(lambda: not self._server_waiting, timeout)
        if not self._reading.acquire(timeout=timeout):
            return True
        try:
            if idle is not None and not idle():
                return True
            with self._lock:  # a rank's connection is dropped under the read turn only: these stay open
                conns = {c.sock.fileno(): c for r in ranks if (c := self.idents.get(r)) is not None}
            conns.pop(-1, None)
            if not conns or self._closed:
                return False
            poller = select.poll()
            for fd in conns:
                poller.register(fd, select.POLLIN)
            ended = False  # a connection that ended: the caller waits while the server's thread drops it
            for fd, _ in poller.poll(max(0.0, timeout) * 1000):
                conn = conns[fd]
                data = read_available(conn.sock)
                if data is None:
                    ended = True
                elif data and not self._consume(conn, data):
                    ended = True
                    try:  # the server's thread sees the end and drops it
                        conn.sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            return not ended
        finally:
            self._reading.release()

    def _drop(self, selector: selectors.BaseSelector, conn: Connection) -> None:
        """Close ``conn``. If it was a rank's, new cells for that rank take the controller's path,
        and its cells still running end after :data:`LOST_GRACE` s unless the cluster reports
        the rank's death first."""
        if self._conns.pop(conn.sock, None) is None:
            return
        selector.unregister(conn.sock)
        conn.sock.close()
        if conn.rank is None:
            return
        with self._lock:
            if self.idents.get(conn.rank) is not conn:
                return  # a connection the rank had replaced
            del self.idents[conn.rank]
            self.pids.pop(conn.rank, None)
            now = time.monotonic()
            self._lost.update({msg_id: now for msg_id, p in self.pending.items() if p.rank == conn.rank})

    def _end_lost(self) -> None:
        now = time.monotonic()
        for msg_id, since in list(self._lost.items()):
            if now - since < LOST_GRACE:
                continue
            del self._lost[msg_id]
            with self._lock:
                p = self.pending.get(msg_id)
            if p is not None:
                self._deliver_reply(msg_id, {
                    "status": "error", "ename": "ChannelError",
                    "evalue": f"the connection to rank {p.rank} was lost while the cell ran (it may still be "
                              "running: %mlx_cluster status)", "traceback": []})

    def _handle(self, conn: Connection, msg: dict[str, Any]) -> None:
        kind = msg["t"]
        if kind == "hello":
            rank = int(msg["rank"])
            conn.rank = rank
            conn.reader.max_payload = wire.MAX_PAYLOAD
            with self._hello:
                self.idents[rank] = conn
                self.pids[rank] = int(msg.get("pid", 0))
                self._hello.notify_all()
        elif kind == "out":
            with self._lock:
                p = self.pending.get(str(msg.get("id")))
            if p is not None:
                p.sink.channel_output(p.rank, str(msg.get("kind")), msg.get("content") or {})
        elif kind == "where":
            with self._lock:
                p = self.pending.get(str(msg.get("id")))
            on_where = getattr(p.sink, "channel_where", None) if p is not None else None  # a cell's sink, not a call's
            if p is not None and on_where is not None and isinstance(msg.get("s"), dict):
                on_where(p.rank, msg["s"])
        elif kind == "dbg":
            with self._lock:
                p = self.pending.get(str(msg.get("id")))
            if p is not None:
                prompt = msg.get("prompt")
                p.sink.channel_debug(p.rank, str(msg.get("text") or ""), None if prompt is None else str(prompt),
                                     bool(msg.get("done")))
        elif kind == "reply":
            self._deliver_reply(str(msg.get("id")), msg.get("content") or {})

    def _deliver_reply(self, msg_id: str, content: dict[str, Any]) -> None:
        """The cell's reply to its sink, once (a cell no longer pending is ignored)."""
        with self._lock:
            p = self.pending.pop(msg_id, None)
        if p is None:
            return
        p._done.set()
        p.sink.channel_reply(p.rank, content)

    def close(self, timeout: float = 2.0) -> None:
        """Close every connection and the listener (the ranks' channels see the end)."""
        self._closed = True
        if self._thread is None:
            self.listener.close()
            os.close(self._wake_r)
        else:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass
            if self._thread is not threading.current_thread():
                self._thread.join(timeout)
        os.close(self._wake_w)


def _has_input(sock: socket.socket) -> bool:
    """Whether ``sock`` holds data or its end (a peek: nothing is taken)."""
    try:
        sock.recv(1, socket.MSG_PEEK)
        return True
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


def notebook_count() -> int:
    """The number of the notebook cell being run (``In[3]``: 3; 0 outside IPython): the ranks number
    the cell the same way, so their tracebacks say ``Cell In[3]``."""
    try:
        from IPython import get_ipython

        ip = get_ipython()
        return int(getattr(ip, "execution_count", 0) or 0) if ip is not None else 0
    except Exception:
        return 0
