"""A rank tells its peers' agents that its cell raised, so that they stop waiting for it.

A cell that raises on one rank while the others block in an MLX collective waiting for it
would hang them for good when nobody supervises the cell (ipyparallel's ``view.execute``,
``%px``, any client of the controller). The raising rank sends one datagram to every peer's
agent; a peer running *the same request* (:func:`same_request`) stops its cell as the
notebook's abort would (:meth:`~mlx_jupyter.cluster.rank.agent.RankAgent.abort`).

Transport: UDP, on the address and port number of each rank's first entry in MLX's ring
hostfile (MLX's ring listens on that TCP port; the UDP port of the same number is ours), so
no address has to be exchanged. Each datagram is signed with the engines' session key
(HMAC-SHA256; the cluster's secret) and dated; an unsigned, stale or replayed one is dropped.
Without a ring hostfile (one rank, MPI, NCCL) there is no peer link: MLX's sockets could
not be told apart anyway.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import socket
import threading
import time
from datetime import datetime
from typing import Any, Callable, Optional

from mlx_jupyter.cluster.shared.wire import CHANNEL_SESSION

log = logging.getLogger("mlx_jupyter.cluster.rank.peers")

#: a peer's request sent up to this long before the raising one (same client, same code) can be of its call
SAME_CALL_WINDOW = 1.0
#: what the client's send loop may add between two ranks' requests of one call beyond the raiser's run
SEND_SLACK = 0.0005
#: a datagram older than this (or dated this far ahead: clocks of hosts differ) is dropped
MAX_AGE = 60.0
#: how many times a datagram goes to a peer on another host (UDP may drop one); once on loopback
REMOTE_COPIES = 2
MAX_DATAGRAM = 8192


def _stamp(value: Any) -> Optional[float]:
    """A header's ``date`` (datetime or ISO text) as a POSIX time; None when absent or unreadable."""
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def request_key(parent: dict[str, Any]) -> Optional[dict[str, Any]]:
    """What identifies the call a cell's ``execute_request`` belongs to, as every rank of that call sees it.

    One call sends each rank its own request: ipyparallel's views one per engine (same client
    session, same code, dates a moment apart), the notebook's cell channel ids ``<cell>-<rank>``.
    """
    header = parent.get("header") or {}
    code = (parent.get("content") or {}).get("code")
    if header.get("msg_type") != "execute_request" or not isinstance(code, str):
        return None
    key = {"session": str(header.get("session", "")),
           "code": hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest(),
           "date": _stamp(header.get("date"))}
    if key["session"] == CHANNEL_SESSION:
        key["cell"] = str(header.get("msg_id", "")).rpartition("-")[0]
    return key


def same_request(mine: Optional[dict[str, Any]], theirs: Any) -> bool:
    """Whether my request and a raising peer's (:func:`request_key`, plus ``ran``: seconds the peer's
    request ran before it raised) are one call: same client, same code, and mine sent before the
    client could have seen the peer's error (by the client's clock: ``date`` + ``ran``). A call the
    client made after the error came back (``for r in ranks: view[r].execute(...)``) is another.
    """
    if not mine or not isinstance(theirs, dict):
        return False
    if mine["session"] != theirs.get("session") or mine["code"] != theirs.get("code"):
        return False
    if "cell" in mine:
        return bool(mine["cell"]) and mine["cell"] == theirs.get("cell")
    a, b, ran = mine.get("date"), theirs.get("date"), theirs.get("ran")
    if not (isinstance(a, float) and isinstance(b, (int, float)) and isinstance(ran, (int, float))):
        return False
    return -SAME_CALL_WINDOW <= a - b <= ran + SEND_SLACK


def ring_rows(hostfile: str) -> list[tuple[str, int]]:
    """Each rank's first ``(host, port)`` in MLX's ring hostfile; [] when there is none."""
    from mlx_jupyter.cluster.rank.sockets import _read_ring

    return [row[0] for row in _read_ring(hostfile)] if hostfile else []


class PeerLink:
    """This rank's datagram socket to its peers' agents; calls ``on_raised(rank, key, error)`` for
    each authentic notice a peer sends (on a thread of its own)."""

    def __init__(self, rank: int, rows: list[tuple[str, int]], key: bytes,
                 on_raised: Callable[[int, dict[str, Any], str], None]):
        self.rank, self.rows, self.key, self.on_raised = rank, rows, key, on_raised
        self._seen: dict[str, float] = {}
        self.sock = self._bind(*rows[rank])
        threading.Thread(target=self._serve, name="mlx-peer-link", daemon=True).start()

    @staticmethod
    def _bind(host: str, port: int) -> socket.socket:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.bind(addr)
        except OSError:
            sock.close()
            raise
        return sock

    def _sign(self, body: bytes) -> bytes:
        return hmac.new(self.key, body, hashlib.sha256).hexdigest().encode()

    def tell_raised(self, key: dict[str, Any], error: str) -> None:
        """Tell every peer that this rank's request ``key`` raised ``error`` (never raises)."""
        body = json.dumps({"from": self.rank, "key": key, "error": error[:2000], "t": time.time(),
                           "nonce": os.urandom(8).hex()}).encode()
        data = self._sign(body) + b" " + body
        for peer, (host, port) in enumerate(self.rows):
            if peer == self.rank:
                continue
            copies = 1 if _is_loopback(host) else REMOTE_COPIES
            for _ in range(copies):
                try:
                    self.sock.sendto(data, (host, port))
                except OSError as exc:
                    log.debug("could not tell rank %d (%s:%d): %s", peer, host, port, exc)

    def _serve(self) -> None:
        while True:
            try:
                data, _ = self.sock.recvfrom(MAX_DATAGRAM)
            except OSError:
                return  # closed
            notice = self._open(data)
            if notice is not None:
                try:
                    self.on_raised(int(notice["from"]), notice.get("key") or {}, str(notice.get("error", "")))
                except Exception:  # pragma: no cover - a bug; keep serving
                    log.exception("peer notice failed")

    def _open(self, data: bytes) -> Optional[dict[str, Any]]:
        """The notice in ``data`` if it is signed with our key, fresh and not seen before."""
        sig, _, body = data.partition(b" ")
        if not hmac.compare_digest(sig, self._sign(body)):
            return None
        try:
            notice = json.loads(body)
            if not isinstance(notice, dict):
                return None
            age = time.time() - float(notice["t"])
            nonce = str(notice["nonce"])
        except (ValueError, KeyError, TypeError):
            return None
        now = time.monotonic()
        self._seen = {n: t for n, t in self._seen.items() if now - t < 2 * MAX_AGE}
        if abs(age) > MAX_AGE or nonce in self._seen:
            return None
        self._seen[nonce] = now
        return notice

    def close(self) -> None:
        self.sock.close()


def _is_loopback(host: str) -> bool:
    from mlx_jupyter.vocab.hosts import is_local

    return is_local(host)


def open_link(rank: int, hostfile: str, key: bytes, on_raised: Callable[[int, dict[str, Any], str], None]) -> Optional[PeerLink]:
    """This rank's peer link, or None (no ring hostfile, a rank alone, no session key, the port taken)."""
    rows = ring_rows(hostfile)
    if len(rows) < 2 or not 0 <= rank < len(rows) or not key:
        return None
    try:
        return PeerLink(rank, rows, key, on_raised)
    except OSError as exc:
        log.warning("rank %d: no peer link on UDP %s:%d (%s): a cell raising here does not release its peers "
                    "unless the notebook supervises it", rank, rows[rank][0], rows[rank][1], exc)
        return None
