"""The wire of a peer copy (a rank's saved files sent to another host's new rank, one TCP connection):
both ends prove the secret with HMAC-SHA-256 over both ends' fresh nonces, the header's sizes are
capped before anything is written, and an HMAC digest over all that was sent is checked before the
files are read. Never the secret itself on the wire; the fetcher proves itself only to a server that did.

    fetcher -> server   MAGIC, nonce_f
    server  -> fetcher  MAGIC, nonce_s, HMAC(key, "server" nonce_f nonce_s)
    fetcher -> server   HMAC(key, "fetcher" nonce_f nonce_s)
    server  -> fetcher  count, sizes, the files, HMAC(key, "data" nonce_f nonce_s header files)
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import struct
import time
from pathlib import Path
from typing import Callable, Optional

from mlx_jupyter.cluster.shared.units import format_bytes

MAGIC = b"MLXPCPY1"
NONCE_BYTES = 32
PROOF_BYTES = 32
#: how long a connection has to prove itself (a silent one holds a handshake this long at most)
HANDSHAKE_TIMEOUT = 5.0
#: the files of one copy: the index and the data
MAX_FILES = 2
_LABEL = b"mlx-jupyter peer copy v1\0"
_COUNT = struct.Struct("!I")
_SIZE = struct.Struct("!Q")
_CHUNK = 4 << 20


class PeerCopyRefused(ConnectionError):
    """The other end did not prove it holds the secret, or what it sent breaks a cap or its digest."""


def copy_key(token: bytes, cluster_key: bytes) -> bytes:
    """The connection's key: the notebook's one-time ``token`` under the cluster's secret (the engines'
    session key), so that someone who read the token off the controller's traffic still lacks it."""
    return hmac.new(cluster_key, _LABEL + b"key\0" + token, hashlib.sha256).digest()


def _proof(key: bytes, role: bytes, nonce_f: bytes, nonce_s: bytes) -> bytes:
    """One end's proof; ``role`` binds it to its side, so a proof reflected back is wrong."""
    return hmac.new(key, _LABEL + role + b"\0" + nonce_f + nonce_s, hashlib.sha256).digest()


def _digest(key: bytes, nonce_f: bytes, nonce_s: bytes) -> "hmac.HMAC":
    return hmac.new(key, _LABEL + b"data\0" + nonce_f + nonce_s, hashlib.sha256)


def read_exact(conn: socket.socket, n: int, deadline: Optional[float] = None) -> bytes:
    """``n`` bytes from ``conn``; by ``deadline`` (``time.monotonic()``) if given, else each read
    within the socket's own timeout."""
    out = bytearray()
    while len(out) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the peer took too long")
            conn.settimeout(left)
        chunk = conn.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        out += chunk
    return bytes(out)


def dial(conn: socket.socket, key: bytes, who: str) -> "hmac.HMAC":
    """The fetcher's half of the handshake on a connected ``conn`` (``who``: the server, in words);
    the digest to check what follows against."""
    nonce_f = secrets.token_bytes(NONCE_BYTES)
    conn.sendall(MAGIC + nonce_f)
    reply = read_exact(conn, len(MAGIC) + NONCE_BYTES + PROOF_BYTES)
    nonce_s, proof = reply[len(MAGIC):-PROOF_BYTES], reply[-PROOF_BYTES:]
    if not (hmac.compare_digest(reply[:len(MAGIC)], MAGIC)
            and hmac.compare_digest(proof, _proof(key, b"server", nonce_f, nonce_s))):
        raise PeerCopyRefused(f"{who} did not prove it holds this restart's secret: nothing was sent to it "
                              "and nothing it sent was read")
    conn.sendall(_proof(key, b"fetcher", nonce_f, nonce_s))
    return _digest(key, nonce_f, nonce_s)


def answer(conn: socket.socket, key: bytes, deadline: float) -> "hmac.HMAC":
    """The server's half of the handshake, all of it by ``deadline``; the digest to sign what it sends."""
    hello = read_exact(conn, len(MAGIC) + NONCE_BYTES, deadline)
    if not hmac.compare_digest(hello[:len(MAGIC)], MAGIC):
        raise PeerCopyRefused("not a peer copy's greeting")
    nonce_f, nonce_s = hello[len(MAGIC):], secrets.token_bytes(NONCE_BYTES)
    conn.sendall(MAGIC + nonce_s + _proof(key, b"server", nonce_f, nonce_s))
    if not hmac.compare_digest(read_exact(conn, PROOF_BYTES, deadline), _proof(key, b"fetcher", nonce_f, nonce_s)):
        raise PeerCopyRefused("the fetcher did not prove it holds this restart's secret")
    return _digest(key, nonce_f, nonce_s)


def send_files(conn: socket.socket, digest: "hmac.HMAC", paths: list[Path]) -> None:
    """The header, each file, and the digest of them all (the files are read once, as sent)."""
    sizes = [p.stat().st_size for p in paths]
    header = _COUNT.pack(len(sizes)) + b"".join(_SIZE.pack(s) for s in sizes)
    digest.update(header)
    conn.sendall(header)
    for path, size in zip(paths, sizes):
        with open(path, "rb") as f:
            left = size
            while left:
                chunk = f.read(min(left, _CHUNK))
                if not chunk:
                    raise OSError(f"{path} shrank while it was sent")
                digest.update(chunk)
                conn.sendall(chunk)
                left -= len(chunk)
    conn.sendall(digest.digest())


def read_header(conn: socket.socket, digest: "hmac.HMAC", room: int, where: str) -> list[int]:
    """The sizes the server announces, refused (before anything is written) past the caps: at most
    :data:`MAX_FILES` files, each and all together at most ``room`` bytes (``where``: that cap's why)."""
    raw = read_exact(conn, _COUNT.size)
    (count,) = _COUNT.unpack(raw)
    if not 0 < count <= MAX_FILES:
        raise PeerCopyRefused(f"the peer's header announces {count} files: the cap is {MAX_FILES}; nothing was written")
    raw += read_exact(conn, _SIZE.size * count)
    sizes = [_SIZE.unpack_from(raw, _COUNT.size + _SIZE.size * i)[0] for i in range(count)]
    for i, size in enumerate(sizes):
        if size > room:
            raise PeerCopyRefused(f"the peer's header announces a file of {format_bytes(size)}: the cap is "
                                  f"{format_bytes(room)} ({where}); nothing was written")
    if sum(sizes) > room:
        raise PeerCopyRefused(f"the peer's header announces {format_bytes(sum(sizes))} in all: the cap is "
                              f"{format_bytes(room)} ({where}); nothing was written")
    digest.update(raw)
    return sizes


def receive_files(conn: socket.socket, digest: "hmac.HMAC", paths: list[Path], sizes: list[int],
                  closed_early: Callable[[], str]) -> None:
    """Write each announced file to its path, then check the digest of all that came: refused
    (:class:`PeerCopyRefused`) if it differs, before anything reads the files."""
    for path, size in zip(paths, sizes):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            left = size
            while left:
                chunk = conn.recv(min(left, _CHUNK))
                if not chunk:
                    raise ConnectionError(closed_early())
                digest.update(chunk)
                view = memoryview(chunk)
                while view.nbytes:
                    view = view[os.write(fd, view):]
                left -= len(chunk)
        finally:
            os.close(fd)
    if not hmac.compare_digest(read_exact(conn, PROOF_BYTES), digest.digest()):
        raise PeerCopyRefused("the copy's digest does not match what came (altered on the way): not read")
