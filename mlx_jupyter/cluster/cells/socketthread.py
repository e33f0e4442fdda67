"""A thread that owns one ZMQ socket (they are not thread-safe): others queue sends and wake it.

Used by the notebook's end of the direct cell channel (:mod:`mlx_jupyter.cluster.cells.hub`).
The wake-up is a pipe polled beside the socket, so the thread sleeps in one poll
until either has something.
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Iterator, Optional

import zmq


def received(socket: zmq.Socket) -> Iterator[list[bytes]]:
    """Every multipart message waiting in ``socket`` now, without blocking."""
    while True:
        try:
            yield socket.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return


class SocketThread:
    """Runs ``send_queued()`` on every wake-up and ``receive()`` whenever ``socket`` is readable."""

    def __init__(self, socket: zmq.Socket, name: str, receive: Callable[[], None],
                 send_queued: Callable[[], None]):
        self.socket = socket
        self.name = name
        self._receive = receive
        self._send_queued = send_queued
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._closed = False
        self.thread: Optional[threading.Thread] = None

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self.thread.start()

    def wake(self) -> None:
        """Have the thread send what is queued (any thread)."""
        if self._wake_w < 0:
            return
        try:
            os.write(self._wake_w, b"x")
        except OSError:  # full (the thread is awake anyway) or closed
            pass

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while not self._closed:
            try:
                events = dict(poller.poll())
            except zmq.ZMQError:
                break
            if self._wake_r in events:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except OSError:
                    pass
            self._send_queued()
            if events.get(self.socket):
                self._receive()
        self._release()

    def _release(self) -> None:
        self.socket.close(linger=0)
        fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
        for fd in fds:
            os.close(fd)

    def close(self, timeout: float = 2.0) -> None:
        """End the thread and close the socket (at once if the thread never started)."""
        self._closed = True
        if self.thread is None:
            self._release()
            return
        self.wake()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)
