"""A live rank's offer of its saved files to another host's new rank (:mod:`.peer_wire`'s server):
on the rank's own interface, several connections at once, each with its own handshake deadline,
until the one fetcher that proves the secret has its copy, or the offer's time is up.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from pathlib import Path

from mlx_jupyter.cluster.rank import peer_wire

log = logging.getLogger("mlx_jupyter.cluster.rank.peer_serve")

#: connections proving themselves at once; past it, the oldest is dropped (a flood cannot lock the fetcher out)
MAX_PENDING = 32


def route_address(host: str) -> str:
    """This host's address on the route to ``host`` (a UDP socket's connect sends nothing)."""
    errors = []
    for family, _, _, _, addr in socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM):
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect(addr)
                return str(probe.getsockname()[0])
            except OSError as exc:
                errors.append(str(exc))
    raise OSError(f"no route to {host} ({'; '.join(errors) or 'no address'})")


def listen(candidates: list[str]) -> socket.socket:
    """A listening socket on the first of ``candidates`` (addresses of this host) that binds; never
    on every interface."""
    errors = []
    for host in candidates:
        if not host:
            continue
        try:
            return socket.create_server((host, 0))
        except OSError as exc:
            errors.append(f"{host}: {exc}")
    raise OSError(f"no interface to offer the names on ({'; '.join(errors) or 'no address known'})")


class Offer:
    """Serves ``paths`` to the first connection that proves ``key`` (:func:`peer_wire.answer`), for
    ``timeout`` s at most; every other connection is dropped at its handshake's deadline or earlier."""

    def __init__(self, server: socket.socket, key: bytes, paths: list[Path], timeout: float):
        self.server, self.key, self.paths, self.timeout = server, key, paths, timeout
        server.setblocking(False)   # a connection reset before accept() must not block the loop
        self.deadline = time.monotonic() + timeout
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._pending: list[socket.socket] = []
        self._claimed = False
        self._wake_r, self._wake_w = socket.socketpair()

    def start(self) -> None:
        threading.Thread(target=self._accept, name="mlx-peer-copy", daemon=True).start()

    def _accept(self) -> None:
        try:
            with self.server, selectors.DefaultSelector() as sel:   # not select(): a rank may hold fds past 1024
                sel.register(self.server, selectors.EVENT_READ)
                sel.register(self._wake_r, selectors.EVENT_READ)
                while not self.done.is_set():
                    left = self.deadline - time.monotonic()
                    if left <= 0:
                        return   # nobody came who proved the secret
                    ready = {key.fileobj for key, _ in sel.select(left)}
                    if self.server in ready and not self.done.is_set():
                        try:
                            conn, _ = self.server.accept()
                        except OSError:
                            continue
                        self._admit(conn)
        finally:
            with self._lock:
                self.done.set()
                for conn in self._pending:
                    _hang_up(conn)
                self._pending = []
                self._wake_r.close()
                self._wake_w.close()

    def _admit(self, conn: socket.socket) -> None:
        with self._lock:   # hung up under the lock: its thread closes it only after taking the lock
            if len(self._pending) >= MAX_PENDING:
                _hang_up(self._pending.pop(0))
            self._pending.append(conn)
        threading.Thread(target=self._serve, args=(conn,), name="mlx-peer-copy-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(peer_wire.HANDSHAKE_TIMEOUT)   # (accepted from a non-blocking listener)
                digest = peer_wire.answer(conn, self.key, min(self.deadline, time.monotonic() + peer_wire.HANDSHAKE_TIMEOUT))
            except (OSError, peer_wire.PeerCopyRefused) as exc:
                log.debug("peer copy: a connection was refused: %s", exc)
                with self._lock:
                    if conn in self._pending:
                        self._pending.remove(conn)
                return
            with self._lock:
                evicted = conn not in self._pending
                if not evicted:
                    self._pending.remove(conn)
                if evicted or self._claimed:
                    return   # one copy per offer: the token is for one fetcher
                self._claimed = True
            try:
                conn.settimeout(self.timeout)
                peer_wire.send_files(conn, digest, self.paths)
            except OSError as exc:
                log.warning("peer copy: sending this rank's saved names failed: %s", exc)
            finally:
                with self._lock:
                    self.done.set()
                    if self._wake_w.fileno() != -1:   # else the accept loop has ended already
                        self._wake_w.send(b"x")


def _hang_up(conn: socket.socket) -> None:
    """End ``conn``'s handshake now (its thread's read returns)."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
