"""The cell channel's TCP I/O: non-blocking sockets, written whole by any thread, read as data comes.

Plain TCP rather than ZMQ: a message then wakes only the thread that reads it,
not a ZMQ I/O thread on each side as well (on a busy machine each wake-up is a
scheduling delay). Used by :mod:`mlx_jupyter.cluster.cells.cell_server` (notebook) and
:mod:`mlx_jupyter.cluster.rank.channel` (rank); the bytes are :mod:`.wire`'s.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from typing import Any, Optional

#: how long a write may wait for the peer to read before the connection counts as broken
SEND_TIMEOUT = 10.0
#: the most one read takes from a socket (the rest waits for the next turn)
READ_CHUNK = 1 << 20


def tune(sock: socket.socket) -> socket.socket:
    """Non-blocking, no Nagle delay (cells and replies are small and wanted at once)."""
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def send_all(sock: socket.socket, data: bytes, timeout: float = SEND_TIMEOUT) -> None:
    """Write all of ``data`` to the non-blocking ``sock``, waiting at most ``timeout`` s for room.

    Raises ``TimeoutError`` if the peer reads nothing for that long, ``OSError`` if the
    connection is gone. Callers that share a socket hold one lock around this.
    """
    view = memoryview(data)
    deadline: Optional[float] = None
    selector: Optional[selectors.BaseSelector] = None
    try:
        while view:
            try:
                view = view[sock.send(view):]
                continue
            except BlockingIOError:
                pass
            now = time.monotonic()
            deadline = now + timeout if deadline is None else deadline
            if now >= deadline:
                raise TimeoutError(f"the peer read nothing for {timeout:g} s")
            if selector is None:
                selector = selectors.DefaultSelector()
                selector.register(sock, selectors.EVENT_WRITE)
            selector.select(deadline - now)
    finally:
        if selector is not None:
            selector.close()


def read_available(sock: socket.socket) -> Optional[bytes]:
    """What ``sock`` holds now (up to :data:`READ_CHUNK`), ``b""`` if nothing; ``None`` once the peer closed."""
    try:
        data = sock.recv(READ_CHUNK)
    except (BlockingIOError, InterruptedError):
        return b""
    except OSError:
        return None
    return data or None


def _libc_send() -> Any:
    """libc's ``send``, called holding the GIL (ctypes.PyDLL), or None where it cannot be had."""
    try:
        import ctypes

        send = ctypes.PyDLL(None, use_errno=True).send
        send.restype = ctypes.c_ssize_t
        send.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int]
        return send
    except (OSError, AttributeError):
        return None


_SEND: Any = None
#: send(2)'s "do not block", where it is defined (Linux, macOS)
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)  # a closed peer: EPIPE, no signal (Linux)


def send_at_once(sock: socket.socket, data: bytes) -> int:
    """Write what of ``data`` the socket takes now without letting another thread run (the GIL kept):
    how many bytes, 0 if none or where this is not possible. Python's own send releases the GIL, and
    a thread that takes it (the kernel's IOPub or history thread at a cell's start) keeps a sender of
    several small messages waiting up to the interpreter's switch interval (5 ms) before the next one."""
    global _SEND
    if _SEND is None:
        _SEND = (_libc_send() if _DONTWAIT else None) or False
    if not _SEND:
        return 0
    sent = _SEND(sock.fileno(), data, len(data), _DONTWAIT | _NOSIGNAL)
    return max(int(sent), 0)


class Writer:
    """One connection's writes, whole and in order from any thread; broken after the first failure."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.broken: Optional[str] = None
        self._lock = threading.Lock()

    def send(self, data: bytes, timeout: float = SEND_TIMEOUT) -> bool:
        """Whether ``data`` was written; a failed write shuts the connection (its reader sees the end)."""
        with self._lock:
            if self.broken is not None:
                return False
            try:
                send_all(self.sock, data, timeout)
                return True
            except OSError as exc:  # TimeoutError included
                self.broken = str(exc) or type(exc).__name__
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                return False

    def send_small(self, data: bytes, timeout: float = SEND_TIMEOUT) -> bool:
        """:meth:`send` for a small message among several sent in a row: written without letting another
        thread take the GIL when the socket has room (:func:`send_at_once`), else as :meth:`send` does."""
        with self._lock:
            if self.broken is None:
                try:
                    done = send_at_once(self.sock, data)
                except Exception:  # e.g. ctypes refusing the arguments: the usual path
                    done = 0
                if done == len(data):
                    return True
                data = data[done:]
        return self.send(data, timeout)

    def close(self) -> None:
        """No more writes (one in progress ends first); the socket is the caller's to close."""
        with self._lock:
            self.broken = self.broken or "closed"
