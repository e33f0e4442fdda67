"""A rank's end of the direct cell channel: cells from the notebook, without the controller.

A ``%%mlx_distributed`` cell through ipyparallel travels notebook -> controller
-> engine, and its reply, status and every output back the same way, each
message (de)serialised three times. Here the notebook sends the cell straight
to the rank (:mod:`mlx_jupyter.cluster.cells.cell_server`), the rank runs it as the kernel runs
an ``execute_request`` (same namespace, history, display hooks, and the rank
agent's pre/post-run hooks that keep the no-hang promise), and its outputs and
reply come straight back. The controller still does registration, heartbeats,
``%px``, push/pull and the control channel (interrupts, aborts, status).

Connection and threads: one TCP connection to the notebook's cell server
(:mod:`mlx_jupyter.cluster.shared.transport`), made by a short-lived thread so
that the engine never waits on the network. Cells are read on the engine's main
loop, which runs them one at a time with the kernel's own shell requests (no
thread hands them over). Outputs and the reply are written by whichever thread
makes them (the main thread, ipykernel's IOPub thread), whole, under one lock.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import sys
import threading
import time
from datetime import datetime, timezone
from typing import Any, Optional

from mlx_jupyter.cluster.shared import wire
from mlx_jupyter.cluster.shared.transport import Writer, read_available, tune
from mlx_jupyter.cluster.rank import cell_runner
from mlx_jupyter.cluster.rank.cell_names import number_cells_as
from mlx_jupyter.cluster.rank.kernel_compat import main_lock
from mlx_jupyter.cluster.shared.kernel_streams import flush_streams
from mlx_jupyter.vocab.hosts import split_addr

log = logging.getLogger("mlx_jupyter.cluster.rank.channel")

#: IOPub message types a cell's outputs are made of (others, e.g. status or comms, are dropped)
FORWARDED = frozenset({"stream", "display_data", "update_display_data", "execute_result", "clear_output"})


def _parent_of(msg_or_type: Any, parent: Any) -> dict[str, Any]:
    """The parent header of a message being sent (``Session.send``'s two ways of being called)."""
    if isinstance(msg_or_type, dict):
        return msg_or_type.get("parent_header") or {}
    if isinstance(parent, dict):
        return parent.get("header", parent) or {}
    return {}


#: the cells' tasks until they end (the loop keeps only weak references to its tasks)
_CELLS: set["asyncio.Future[None]"] = set()


class RankChannel:
    """Connects to the notebook's channel at ``url`` and runs the cells it sends."""

    def __init__(self, kernel: Any, rank: int, url: str, connect_timeout: float = 30.0):
        """Begins connecting (on a thread of its own); the hello follows once connected."""
        self.kernel = kernel
        self.session = kernel.session
        self.rank = rank
        self.url = url
        self.host, self.port = split_addr(url.split("://", 1)[-1])  # tcp://host:port
        self.connect_timeout = connect_timeout
        self._seen: collections.deque[object] = collections.deque(maxlen=256)  # ids run: a replayed cell is dropped
        self._reader = wire.FrameReader()
        self.sock: Optional[socket.socket] = None
        self.writer: Optional[Writer] = None
        self.error = ""  # why the channel is not (or no longer) connected
        self.connected = threading.Event()
        self._closed = False
        self._pid = os.getpid()
        self._debug_lines: collections.deque[Optional[str]] = collections.deque()  # a debug session's answers (dbg_in)
        self._route_outputs()
        threading.Thread(target=self._connect, name="mlx-cell-connect", daemon=True).start()

    def _connect(self) -> None:
        """Dial the cell server (retrying a refusal until ``connect_timeout``), then hand the socket to the loop."""
        deadline = time.monotonic() + self.connect_timeout
        pause = 0.01
        while not self._closed:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(0.1, deadline - time.monotonic()))
                break
            except OSError as exc:
                if time.monotonic() + pause >= deadline:
                    self.error = f"could not connect to the notebook's cell channel at {self.url}: {exc}"
                    log.warning("cell channel: %s", self.error)
                    return
                time.sleep(pause)  # refused or unreachable: the cell server may not listen yet
                pause = min(pause * 2, 0.5)
        else:
            return
        self.kernel.io_loop.add_callback(self._attach, tune(sock))

    def _attach(self, sock: socket.socket) -> None:
        """On the main loop: read cells from ``sock``, say hello."""
        if self._closed:
            sock.close()
            return
        self.sock, self.writer = sock, Writer(sock)
        self.kernel.io_loop.add_handler(sock.fileno(), self._on_readable, self.kernel.io_loop.READ)
        self.post({"t": "hello", "rank": self.rank, "pid": os.getpid()})
        self.connected.set()

    # ------------------------------------------------------------ outbound (any thread)

    def post(self, obj: dict[str, Any]) -> None:
        """Send ``obj`` to the notebook (from any thread; in order per thread)."""
        writer = self.writer
        if os.getpid() != self._pid:
            return  # a forked child (multiprocessing): its writes would interleave with ours
        if writer is None:
            log.error("cell channel: not connected, dropped %s", obj.get("t"))
            return
        try:
            frames = wire.encode(self.session, obj)
        except Exception as exc:  # e.g. content that does not pack: say so instead of the output
            log.error("cell channel: could not send %s: %s", obj.get("t"), exc)
            if obj.get("t") != "reply":
                return
            bad = {"status": "error", "ename": type(exc).__name__, "evalue": f"the reply did not pack: {exc}",
                   "traceback": []}
            frames = wire.encode(self.session, {"t": "reply", "id": obj.get("id", ""), "content": bad})
        if not writer.send(wire.frame(frames)) and not self.error:
            self.error = f"the connection to the notebook broke: {writer.broken}"
            log.error("cell channel: %s (%s not sent; cells now come through the controller)",
                      self.error, obj.get("t"))

    def _route_outputs(self) -> None:
        """Outputs of the channel's cells go to the notebook, not to IOPub (wraps ``Session.send``).

        ipyparallel wraps the engine session's ``send`` the same way (to add metadata);
        stream, display and result messages all pass through it.
        """
        original = self.session.send
        channel = self

        def send(stream: Any, msg_or_type: Any, content: Any = None, parent: Any = None, *args: Any,
                 **kwargs: Any) -> Any:
            header = _parent_of(msg_or_type, parent)
            if header.get("session") != wire.CHANNEL_SESSION:
                return original(stream, msg_or_type, content, parent, *args, **kwargs)
            if isinstance(msg_or_type, dict):
                kind, content = msg_or_type.get("header", {}).get("msg_type", ""), msg_or_type.get("content")
            else:
                kind = str(msg_or_type)
            if kind in FORWARDED:
                channel.post({"t": "out", "id": header.get("msg_id", ""), "kind": kind, "content": content})
            return {"header": {"msg_type": kind}, "parent_header": header, "content": content, "metadata": {}}

        send.__wrapped__ = original  # type: ignore[attr-defined]
        self.session.send = send

    # ------------------------------------------------------------ inbound (main loop)

    def _on_readable(self, fd: int, events: int) -> None:
        sock = self.sock
        if sock is None:
            return
        data = read_available(sock)
        if data is None:
            self._lost("the notebook closed the connection")
            return
        try:
            pairs = self._reader.feed(data)
        except wire.WireError as exc:
            self._lost(f"the notebook sent {exc}")
            return
        for frames in pairs:
            try:
                msg = wire.decode(self.session, frames)
            except wire.WireError as exc:
                log.warning("cell channel: dropped a message: %s", exc)
                continue
            if msg["t"] == "cell" and msg.get("id") not in self._seen:
                self._seen.append(msg.get("id"))
                # a task, not the loop's add_callback: that wakes the loop through its pipe and then
                # wraps the coroutine in a second callback, two turns of the loop before the cell starts
                _CELLS.add(task := asyncio.ensure_future(self._execute(msg)))
                task.add_done_callback(_CELLS.discard)
            elif msg["t"] == "dbg_in":
                line = msg.get("line")
                self._debug_lines.append(None if line is None else str(line))
            elif msg["t"] == "call" and msg.get("id") not in self._seen:   # the product's own (rank/calls.py)
                from mlx_jupyter.cluster.rank import calls

                self._seen.append(msg.get("id"))
                self.kernel.io_loop.add_callback(calls.run, self.kernel, self.post, msg)

    def drop_debug_lines(self) -> None:
        """Forget answers no session read (sent as an abort ended the session): a new session's come after its prompt."""
        self._debug_lines.clear()

    def wait_debug_line(self) -> Optional[str]:
        """The notebook's next answer to a debug prompt (None: it cannot prompt), read here on the
        cell's thread, which the session blocks anyway. No timeout: Ctrl-C (an abort) ends it."""
        import select

        while not self._debug_lines:
            sock = self.sock
            if sock is None:
                return None  # the connection is gone: nobody can answer
            select.select([sock], [], [])
            self._on_readable(sock.fileno(), 0)
        return self._debug_lines.popleft()

    def _lost(self, why: str) -> None:
        """The connection ended: stop reading it (cells then come through the controller)."""
        self.error = why
        self._detach()

    def _detach(self) -> None:
        self.connected.clear()
        sock, self.sock = self.sock, None
        if sock is None:
            return
        try:
            self.kernel.io_loop.remove_handler(sock.fileno())
        except Exception:
            pass
        if self.writer is not None:
            self.writer.close()
        sock.close()

    # ------------------------------------------------------------ running a cell (main thread)

    async def _execute(self, msg: dict[str, Any]) -> None:
        """Run one cell as ipykernel's ``execute_request`` would, then post its reply."""
        kernel = self.kernel
        msg_id = str(msg.get("id", ""))
        code = str(msg.get("code", ""))
        count, first = msg.get("count"), msg.get("first")
        request = {
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": wire.CHANNEL_SESSION,
                       "username": "mlx_jupyter", "date": datetime.now(timezone.utc), "version": "5.3"},
            "parent_header": {}, "metadata": {}, "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False},
        }
        request["msg_id"], request["msg_type"] = msg_id, "execute_request"
        # one request at a time, with %px cells and apply requests
        lock = main_lock(kernel)
        reply: Optional[dict[str, Any]] = None
        try:
            async with lock:
                number_cells_as(kernel.shell, count if isinstance(count, int) else 0,
                                first if isinstance(first, int) else 1)
                try:
                    reply = await self._run(request, code)
                finally:
                    number_cells_as(kernel.shell, 0)
        except BaseException as exc:  # never leave the notebook without a reply
            reply = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": []}
        finally:
            self._reply(msg_id, reply)

    async def _run(self, request: dict[str, Any], code: str) -> dict[str, Any]:
        kernel = self.kernel
        kernel.set_parent([], request, channel="shell")
        kernel.pre_handler_hook()  # SIGINT -> KeyboardInterrupt while the cell runs, as for execute_request
        try:
            return await cell_runner.run_cell(kernel, code)
        except KeyboardInterrupt:
            return {"status": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": []}
        finally:
            kernel.post_handler_hook()

    def _reply(self, msg_id: str, reply: Optional[dict[str, Any]]) -> None:
        """Flush the cell's streams (their outputs are posted first), then post the reply."""
        from jupyter_client.jsonutil import json_clean

        for _ in range(3):  # a late interrupt landing here must not eat the reply
            try:
                flush_streams([sys.stdout, sys.stderr])
                break
            except KeyboardInterrupt:
                continue
        content = reply or {"status": "error", "ename": "RuntimeError", "evalue": "no reply", "traceback": []}
        try:
            if not _plain(content):   # an error's traceback, a payload: made JSON-safe
                content = json_clean(content)
        except Exception:
            content = {k: content.get(k) for k in ("status", "ename", "evalue", "traceback") if k in content}
        self.post({"t": "reply", "id": msg_id, "content": content})

    def close(self) -> None:
        """Stop connecting or reading, and close the connection (on the main loop)."""
        self._closed = True
        self._detach()


#: the reply of a cell that ran without error and left no payload (cell_runner): JSON already
_PLAIN_OK = {"status", "execution_count", "user_expressions", "payload"}


def _plain(content: dict[str, Any]) -> bool:
    """Whether ``content`` is an ok reply with nothing in it for ``json_clean`` to change."""
    return (content.get("status") == "ok" and set(content) <= _PLAIN_OK and isinstance(content.get("execution_count"), int)
            and not content.get("user_expressions") and not content.get("payload"))


#: this rank's channel, once connected; why it could not be, if it could not
CHANNEL: Optional[RankChannel] = None
ERROR = ""


def start(kernel: Any, rank: int, interface: str, port: Optional[int]) -> Optional[RankChannel]:
    """Connect this rank to the notebook's channel at ``port`` if the launch named one (RankEnv.cell_port).

    ``interface`` is the controller's (``tcp://host``): the notebook's channel listens beside it.
    """
    global CHANNEL
    if not port:
        return None
    CHANNEL = RankChannel(kernel, rank, f"{interface}:{port}")
    return CHANNEL

