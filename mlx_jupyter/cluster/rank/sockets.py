"""Socket forensics on a rank: which of this process's sockets are MLX's ring, which ports listen.

Linux reads /proc; elsewhere psutil. Used to close MLX's world sockets under a blocked
collective (the only way to release it) and to skip MLX's connect-retry pause at start.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from mlx_jupyter.vocab.hosts import Address


def socket_fds() -> dict[int, int]:
    """Open socket fds of this process -> inode (Linux /proc; psutil elsewhere)."""
    out: dict[int, int] = {}
    if os.path.isdir("/proc/self/fd"):
        for name in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{name}")
            except OSError:
                continue
            if target.startswith("socket:["):
                out[int(name)] = int(target[8:-1])
        return out
    try:
        import psutil

        for conn in psutil.Process().net_connections(kind="inet"):
            if conn.fd >= 0:
                out[conn.fd] = os.fstat(conn.fd).st_ino
    except Exception:
        pass
    return out


def _read_ring(path: str) -> list[list[Address]]:
    """The ring hostfile at ``path`` (one parser: :func:`mlx_jupyter.vocab.rank_env.parse_ring_hostfile`);
    [] if unreadable."""
    from mlx_jupyter.vocab.rank_env import parse_ring_hostfile

    try:
        with open(path, encoding="utf-8") as fh:
            return parse_ring_hostfile(fh.read(), path)
    except (OSError, ValueError):
        return []


def _hostfile_ports(path: str) -> set[int]:
    """The ring ports (every rank's) of MLX's hostfile at ``path``, or an empty set."""
    return {port for rank in _read_ring(path) for _, port in rank} if path else set()


def _proc_tcp_rows() -> list[tuple[int, int, str, int]]:
    """(local port, remote port, state, socket inode) of each row of Linux's /proc/self/net/tcp{,6}."""
    rows = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/self/net/{table}") as fh:
                next(fh)
                for line in fh:
                    f = line.split()
                    rows.append((int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16), f[3], int(f[9])))
        except (OSError, ValueError, IndexError, StopIteration):
            continue
    return rows


def _tcp_ports_by_inode() -> dict[int, tuple[int, int]]:
    """socket inode -> (local port, remote port) for this process's TCP sockets."""
    out: dict[int, tuple[int, int]] = {}
    if os.path.isdir("/proc/self/net"):
        for local, remote, _state, inode in _proc_tcp_rows():
            out[inode] = (local, remote)
        return out
    try:
        import psutil

        for conn in psutil.Process().net_connections(kind="tcp"):
            if conn.fd >= 0:
                out[os.fstat(conn.fd).st_ino] = (conn.laddr.port if conn.laddr else 0,
                                                 conn.raddr.port if conn.raddr else 0)
    except Exception:
        pass
    return out


def world_socket_fds(before: dict[int, int], hostfile: str) -> dict[int, int]:
    """Sockets opened since ``before`` that belong to MLX's ring (the ports of its ``hostfile``).

    Other threads (the engine's ZMQ) open sockets at the same time; only those on
    a ring port are MLX's. Without a readable hostfile (MPI, NCCL) none is: shutting
    sockets we cannot attribute broke more than it released (MPI: its job aborted).
    """
    ports = _hostfile_ports(hostfile)
    if not ports:
        return {}
    new = {fd: ino for fd, ino in socket_fds().items() if before.get(fd) != ino}
    by_inode = _tcp_ports_by_inode()
    return {fd: ino for fd, ino in new.items() if ino in by_inode and (set(by_inode[ino]) & ports)}


def _listening_ports() -> Optional[set[int]]:
    """TCP ports listening on this machine (Linux /proc; psutil elsewhere), None when unknown."""
    if os.path.isdir("/proc/self/net"):
        return {local for local, _remote, state, _inode in _proc_tcp_rows() if state == "0A"}  # TCP_LISTEN
    try:
        import psutil

        return {c.laddr.port for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
    except Exception:  # macOS without root: not allowed to list other processes' sockets
        return None


def ring_ports_to_await(rank: int, hostfile: str) -> set[int]:
    """The first ring port of every other rank, if this is the ring's last rank and all ranks are local.

    MLX's last rank connects first; the others accept first. A connection refused
    because its peer is not listening yet costs a one-second retry pause, with the
    GIL held (the engine stands still). The last rank waiting for the others'
    ports to listen skips that pause.
    """
    from mlx_jupyter.vocab.hosts import is_local

    firsts = [row[0] for row in _read_ring(hostfile)]
    if len(firsts) < 2 or rank != len(firsts) - 1 or not all(is_local(ip) for ip, _ in firsts):
        return set()
    return {port for _, port in firsts[:-1]}


def wait_listening(ports: set[int], timeout: float, poll: float = 0.005) -> bool:
    """Until every port of ``ports`` listens here (True), ``timeout`` passes or it cannot be known (False)."""
    end = time.monotonic() + timeout
    while True:
        listening = _listening_ports()
        if listening is None:
            return False
        if ports <= listening:
            return True
        if time.monotonic() > end:
            return False
        time.sleep(poll)


def shutdown_sockets(sockets: dict[int, int]) -> bool:
    """Shut down each fd -> inode of ``sockets`` still open as that socket; whether one was."""
    closed = False
    current = socket_fds()
    for fd, inode in sockets.items():
        if current.get(fd) != inode:
            continue
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
            closed = True
        except OSError:
            pass
        finally:
            sock.detach()
    return closed
