"""A rank's end of the direct cell channel: cells from the notebook, without the controller.

A ``%%mlx_distributed`` cell through ipyparallel travels notebook -> controller
-> engine, and its reply, status and every output back the same way, each
message (de)serialised three times. Here the notebook sends the cell straight
to the rank (:mod:`mlx_jupyter.cluster.cells.hub`), the rank runs it as the kernel runs
an ``execute_request`` (same namespace, history, display hooks, and the rank
agent's pre/post-run hooks that keep the no-hang promise), and its outputs and
reply come straight back. The controller still does registration, heartbeats,
``%px``, push/pull and the control channel (interrupts, aborts, status).

Threads: one thread owns the DEALER socket (ZMQ sockets are not thread-safe);
cells are handed to the engine's main loop, which runs them one at a time with
the kernel's own shell requests; outputs are posted from whichever thread makes
them (the main thread, ipykernel's IOPub thread) through a queue.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
from datetime import datetime, timezone
from typing import Any, Optional

import zmq

from mlx_jupyter.cluster.cells import wire
from mlx_jupyter.cluster.cells.socketthread import SocketThread, received
from mlx_jupyter.cluster.rank.kernel_compat import main_lock

log = logging.getLogger("mlx_jupyter.cluster.rank.channel")

#: IOPub message types a cell's outputs are made of (others, e.g. status or comms, are dropped)
FORWARDED = frozenset({"stream", "display_data", "update_display_data", "execute_result", "clear_output"})


def _parent_of(msg_or_type: Any, parent: Any) -> dict:
    """The parent header of a message being sent (``Session.send``'s two ways of being called)."""
    if isinstance(msg_or_type, dict):
        return msg_or_type.get("parent_header") or {}
    if isinstance(parent, dict):
        return parent.get("header", parent) or {}
    return {}


def flush_streams(streams: list[Any], timeout: float = 10.0) -> None:
    """Flush the cell's stdout and stderr with one round trip to ipykernel's IOPub thread.

    ``OutStream.flush`` makes a round trip each (two per cell). Their thread runs what is
    scheduled in order, so one marker after both (and after a stream's ``_flush`` only
    if it holds text) means every output of the cell has been sent, and so posted here,
    before the reply. Streams that are not ipykernel's are flushed as usual.
    """
    streams = [s for s in streams if s is not None]
    pub = getattr(streams[0], "pub_thread", None) if streams else None
    thread = getattr(pub, "thread", None)
    if (pub is None or thread is None or not thread.is_alive() or thread.ident == threading.get_ident()
            or not all(getattr(s, "pub_thread", None) is pub and hasattr(s, "_flush") for s in streams)):
        for s in streams:
            s.flush()
        return
    for s in streams:
        if getattr(s, "_flush_pending", True) or getattr(s, "_buffers", True):
            pub.schedule(s._flush)
    done = threading.Event()
    pub.schedule(done.set)
    if not done.wait(timeout):
        print("mlx_jupyter: flushing the cell's output timed out", file=sys.__stderr__)


class RankChannel:
    """Connects to the notebook's channel at ``url`` and runs the cells it sends."""

    def __init__(self, kernel: Any, rank: int, url: str):
        self.kernel = kernel
        self.session = kernel.session
        self.rank = rank
        self.url = url
        self._out: collections.deque = collections.deque()
        self._seen: collections.deque = collections.deque(maxlen=256)  # ids run: a replayed cell is dropped
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SNDHWM, 0)  # a burst of outputs queues, never blocks or drops (as IOPub)
        self.socket.setsockopt(zmq.IDENTITY, f"rank{rank}-{os.getpid()}".encode())
        self.socket.connect(url)
        self._route_outputs()
        self._io = SocketThread(self.socket, "mlx-cell-channel", self._receive, self._send_queued)
        self.post({"t": "hello", "rank": rank, "pid": os.getpid()})
        self._io.start()

    # ------------------------------------------------------------ outbound (any thread)

    def post(self, obj: dict) -> None:
        """Send ``obj`` to the notebook (from any thread; in order per thread)."""
        self._out.append(obj)
        self._io.wake()

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

    # ------------------------------------------------------------ the socket's thread

    def _send_queued(self) -> None:
        while self._out:
            obj = self._out.popleft()
            try:
                self.socket.send_multipart(wire.encode(self.session, obj), copy=True)
            except Exception as exc:  # e.g. content that does not pack: say so instead of the output
                log.error("cell channel: could not send %s: %s", obj.get("t"), exc)
                if obj.get("t") == "reply":
                    bad = {"status": "error", "ename": type(exc).__name__, "evalue": f"the reply did not pack: {exc}",
                           "traceback": []}
                    self._out.appendleft({"t": "reply", "id": obj.get("id", ""), "content": bad})

    def _receive(self) -> None:
        for frames in received(self.socket):
            try:
                msg = wire.decode(self.session, frames)
            except wire.WireError as exc:
                log.warning("cell channel: dropped a message: %s", exc)
                continue
            if msg["t"] == "cell" and msg.get("id") not in self._seen:
                self._seen.append(msg.get("id"))
                self.kernel.io_loop.add_callback(self._execute, msg)

    # ------------------------------------------------------------ running a cell (main thread)

    async def _execute(self, msg: dict) -> None:
        """Run one cell as ipykernel's ``execute_request`` would, then post its reply."""
        kernel = self.kernel
        msg_id = str(msg.get("id", ""))
        code = str(msg.get("code", ""))
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
        reply: Optional[dict] = None
        try:
            async with lock:
                reply = await self._run(request, code)
        except BaseException as exc:  # never leave the notebook without a reply
            reply = {"status": "error", "ename": type(exc).__name__, "evalue": str(exc), "traceback": []}
        finally:
            self._reply(msg_id, reply)

    async def _run(self, request: dict, code: str) -> dict:
        kernel = self.kernel
        kernel.set_parent([], request, channel="shell")
        kernel.pre_handler_hook()  # SIGINT -> KeyboardInterrupt while the cell runs, as for execute_request
        try:
            return await kernel.do_execute(code, False, store_history=True, user_expressions={}, allow_stdin=False)
        except KeyboardInterrupt:
            return {"status": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": []}
        finally:
            kernel.post_handler_hook()

    def _reply(self, msg_id: str, reply: Optional[dict]) -> None:
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
            content = json_clean(content)
        except Exception:
            content = {k: content.get(k) for k in ("status", "ename", "evalue", "traceback") if k in content}
        self.post({"t": "reply", "id": msg_id, "content": content})

    def close(self) -> None:
        self._io.close()


#: this rank's channel, once connected; why it could not be, if it could not
CHANNEL: Optional[RankChannel] = None
ERROR = ""


def start(kernel: Any, rank: int, interface: str) -> Optional[RankChannel]:
    """Connect this rank to the notebook's channel if the launch named one (``MLX_JUPYTER_CELL_PORT``).

    ``interface`` is the controller's (``tcp://host``): the notebook's channel listens beside it.
    """
    global CHANNEL
    port = os.environ.get(wire.PORT_ENV, "")
    if not port.isdigit() or int(port) == 0:
        return None
    CHANNEL = RankChannel(kernel, rank, f"{interface}:{int(port)}")
    return CHANNEL

