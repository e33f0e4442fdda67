"""The peer-restore connection (a live rank's saved names sent to another host's new rank) trusts
no one who cannot prove the restart's secret: a fake server is refused before anything it sent is
read, a tampered copy is refused before it is unpickled, an oversized header before anything is
written, idle connections do not block the real fetcher, and the offer is on one interface only.
All on loopback; the fake ends are plain sockets in threads of this test.
"""

from __future__ import annotations

import os
import pickle
import secrets
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import psutil
import pytest

from mlx_jupyter.cluster.rank import keep, keep_files, peer_copy

pytestmark = pytest.mark.timeout(60)

MAGIC_LEN, NONCE_LEN, PROOF_LEN = 8, 32, 32
#: idle connections at once: past the server's cap (peer_serve.MAX_PENDING, 32)
FLOOD = 36


class _Mkdir:
    """Unpickled, it makes a directory: the proof that something was unpickled."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (str(self.path),))


@pytest.fixture
def folder_name() -> Iterator[str]:
    name = keep_files.folder_name("peer-copy-test", secrets.token_hex(8))
    yield name
    keep_files.remove_all(name)


def _save(name: str, ns: dict) -> None:
    keep.save(name, 0, ns, digests=True)


def _fake_server(respond: Callable[[socket.socket], bytes]) -> tuple[int, dict, threading.Thread]:
    """A one-connection listener on loopback running ``respond`` (which returns what it read);
    all the fetcher sent lands in ``got``."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(20)
    got: dict = {"bytes": b""}

    def run() -> None:
        with server:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(20)
                got["bytes"] = respond(conn)
                try:   # everything the fetcher sends until it hangs up
                    while chunk := conn.recv(1 << 16):
                        got["bytes"] += chunk
                except OSError:
                    pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return server.getsockname()[1], got, thread


def _evil_files(marker: Path) -> bytes:
    """A header naming an index and no data, then an index that makes ``marker`` when unpickled."""
    index = pickle.dumps(_Mkdir(marker))
    return struct.pack("!QQ", len(index), 0) + index


@pytest.mark.parametrize("shape", ["files at once", "a handshake without the secret"])
def test_a_server_without_the_secret_is_refused_and_nothing_it_sent_is_unpickled(folder_name, tmp_path, shape):
    marker = tmp_path / "unpickled"
    token = secrets.token_hex(peer_copy.TOKEN_BYTES)

    def respond(conn: socket.socket) -> bytes:
        first = conn.recv(MAGIC_LEN + NONCE_LEN)   # the fetcher's first message (its token, once)
        if shape == "a handshake without the secret":
            conn.sendall(b"MLXPCPY1" + os.urandom(NONCE_LEN + PROOF_LEN))
        conn.sendall(_evil_files(marker))
        return first

    port, got, thread = _fake_server(respond)
    with pytest.raises(ConnectionError, match="did not prove it holds this restart's secret"):
        peer_copy.fetch_from(folder_name, 0, "127.0.0.1", port, token, ["x"], timeout=20)
    thread.join(20)
    assert not marker.exists(), "the fake server's pickle was loaded"
    assert bytes.fromhex(token) not in got["bytes"]
    assert len(got["bytes"]) == MAGIC_LEN + NONCE_LEN   # its greeting only: no proof to a server that gave none
    assert not list(keep_files.keep_dir(folder_name).glob("copy0.*"))


def test_a_copy_altered_on_the_way_is_refused_before_it_is_read(folder_name, monkeypatch):
    """A relay between the two ranks flips one byte of an array's data: refused, nothing bound."""
    monkeypatch.setattr(peer_copy, "_ring_address", lambda rank: "127.0.0.1")
    mark = b"\x13\x37peer-copy-mark!"
    _save(folder_name, {"w": np.frombuffer(mark + bytes(48), dtype=np.uint8).copy(), "n": 3})
    token = secrets.token_hex(peer_copy.TOKEN_BYTES)
    offer = peer_copy.serve(folder_name, 0, token, timeout=20)
    relay = socket.create_server(("127.0.0.1", 0))
    relay.settimeout(20)

    def pump(src: socket.socket, dst: socket.socket, flip: bool) -> None:
        seen, flipped = b"", False
        try:
            while chunk := src.recv(1 << 16):
                start, seen = len(seen), seen + chunk
                at = seen.find(mark)
                if flip and not flipped and at >= 0 and at + len(mark) < len(seen):
                    i = at + len(mark) - start   # the byte after the mark, not sent yet
                    chunk = chunk[:i] + bytes([chunk[i] ^ 1]) + chunk[i + 1:]
                    flipped = True
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def run() -> None:
        with relay:
            a, _ = relay.accept()
            b = socket.create_connection(("127.0.0.1", offer["port"]), 20)
            back = threading.Thread(target=pump, args=(b, a, True), daemon=True)
            back.start()
            pump(a, b, False)
            back.join(20)
            a.close()
            b.close()

    threading.Thread(target=run, daemon=True).start()
    with pytest.raises(ConnectionError, match="digest does not match"):
        peer_copy.fetch_from(folder_name, 0, "127.0.0.1", relay.getsockname()[1], token, ["w", "n"], timeout=20)
    assert not list(keep_files.keep_dir(folder_name).glob("copy0.*"))


@pytest.mark.parametrize("header, cap", [((2, [1 << 60, 0]), "a file of"), ((2, [1 << 40, 1 << 40]), "a file of"),
                                         ((1 << 31, []), "announces 2147483648 files: the cap is 2")])
def test_an_oversized_header_is_refused_before_anything_is_written(folder_name, header, cap):
    """A server that proves the secret (a peer gone wrong) announces more than the room here."""
    from mlx_jupyter.cluster.rank import peer_wire

    token = secrets.token_hex(peer_copy.TOKEN_BYTES)
    count, sizes = header

    def respond(conn: socket.socket) -> bytes:
        peer_wire.answer(conn, peer_copy._copy_key(token), deadline=time.monotonic() + 20)
        conn.sendall(struct.pack("!I", count) + b"".join(struct.pack("!Q", s) for s in sizes))
        return b""

    port, _, thread = _fake_server(respond)
    room = keep_files.keep_root()
    with pytest.raises(ConnectionError, match=f"{cap}.*nothing was written"):
        peer_copy.fetch_from(folder_name, 0, "127.0.0.1", port, token, ["x"], timeout=20)
    thread.join(20)
    assert not list(keep_files.keep_dir(folder_name, room).glob("copy0.*"))


def test_two_idle_connections_do_not_make_the_real_fetch_time_out(folder_name, monkeypatch):
    monkeypatch.setattr(peer_copy, "_ring_address", lambda rank: "127.0.0.1")
    _save(folder_name, {"w": np.arange(5.0), "n": 3})
    token = secrets.token_hex(peer_copy.TOKEN_BYTES)
    offer = peer_copy.serve(folder_name, 0, token, timeout=10)
    idle = [socket.create_connection(("127.0.0.1", offer["port"]), 10) for _ in range(2)]
    try:
        got = peer_copy.fetch_from(folder_name, 0, "127.0.0.1", offer["port"], token, ["w", "n"], timeout=10)
        assert sorted(got["restored"]) == ["n", "w"], got
    finally:
        for s in idle:
            s.close()


def test_a_proof_reflected_back_to_the_server_gets_nothing(folder_name, monkeypatch):
    """A stranger that sends the server's own proof back as the fetcher's is hung up on."""
    monkeypatch.setattr(peer_copy, "_ring_address", lambda rank: "127.0.0.1")
    _save(folder_name, {"n": 3})
    offer = peer_copy.serve(folder_name, 0, secrets.token_hex(peer_copy.TOKEN_BYTES), timeout=10)
    with socket.create_connection(("127.0.0.1", offer["port"]), 10) as conn:
        conn.sendall(b"MLXPCPY1" + os.urandom(NONCE_LEN))
        reply = b""
        while len(reply) < MAGIC_LEN + NONCE_LEN + PROOF_LEN:
            chunk = conn.recv(1 << 10)
            assert chunk, "the server hung up before it proved itself"
            reply += chunk
        conn.sendall(reply[-PROOF_LEN:])
        assert conn.recv(1 << 10) == b""   # closed, not one byte of the files


def _listening(port: int) -> list[str]:
    return [c.laddr.ip for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port]


def test_without_a_ring_hostfile_the_offer_is_on_the_interface_toward_the_fetcher(folder_name, monkeypatch):
    monkeypatch.setattr(peer_copy, "_ring_address", lambda rank: "")
    _save(folder_name, {"n": 3})
    token = secrets.token_hex(peer_copy.TOKEN_BYTES)
    offer = peer_copy.serve(folder_name, 0, token, timeout=10, toward="127.0.0.1")
    assert offer["host"] == "127.0.0.1" and _listening(offer["port"]) == ["127.0.0.1"]
    got = peer_copy.fetch_from(folder_name, 0, "127.0.0.1", offer["port"], token, ["n"], timeout=10)
    assert got["restored"] == ["n"]
    with pytest.raises(OSError, match="not offered on every interface"):
        peer_copy.serve(folder_name, 0, token, timeout=10)   # nothing to tell the interface by


def test_a_flood_of_idle_connections_past_the_cap_drops_the_oldest_and_the_fetch_gets_through(folder_name, monkeypatch):
    monkeypatch.setattr(peer_copy, "_ring_address", lambda rank: "127.0.0.1")
    _save(folder_name, {"n": 3})
    token = secrets.token_hex(peer_copy.TOKEN_BYTES)
    offer = peer_copy.serve(folder_name, 0, token, timeout=10)
    idle = [socket.create_connection(("127.0.0.1", offer["port"]), 10) for _ in range(FLOOD)]
    try:
        idle[0].settimeout(4)   # dropped for the newer ones, well before its handshake's 5 s
        assert idle[0].recv(16) == b""
        got = peer_copy.fetch_from(folder_name, 0, "127.0.0.1", offer["port"], token, ["n"], timeout=10)
        assert got["restored"] == ["n"]
    finally:
        for s in idle:
            s.close()
    from mlx_jupyter.cluster.rank import peer_serve

    assert FLOOD > peer_serve.MAX_PENDING


def test_the_token_alone_is_not_the_key_without_the_clusters_secret(folder_name, monkeypatch):
    """Someone who read the token off the controller's traffic, but lacks the engines' session key."""
    from types import SimpleNamespace

    from mlx_jupyter.cluster.rank import agent

    monkeypatch.setattr(peer_copy, "_ring_address", lambda rank: "127.0.0.1")
    _save(folder_name, {"n": 3})
    token = secrets.token_hex(peer_copy.TOKEN_BYTES)
    monkeypatch.setattr(agent, "AGENT", SimpleNamespace(kernel=SimpleNamespace(session=SimpleNamespace(key=b"k" * 32))))
    offer = peer_copy.serve(folder_name, 0, token, timeout=10)
    monkeypatch.setattr(agent, "AGENT", None)
    with pytest.raises(ConnectionError, match="did not prove it holds this restart's secret"):
        peer_copy.fetch_from(folder_name, 0, "127.0.0.1", offer["port"], token, ["n"], timeout=10)


def test_the_notebook_names_the_fetchers_host_as_the_serving_rank_can_route_to_it(monkeypatch):
    from mlx_jupyter.cluster import peer_restore
    from mlx_jupyter.cluster.rank import peer_serve

    monkeypatch.setattr(peer_serve, "route_address", lambda host: f"this machine toward {host}")
    assert peer_restore._toward("fetcher.example", "server.example") == "fetcher.example"
    assert peer_restore._toward("127.0.0.1", "localhost") == "127.0.0.1"   # both here: loopback
    # the fetcher on the notebook's machine, the server elsewhere: "localhost" means nothing there
    assert peer_restore._toward("localhost", "server.example") == "this machine toward server.example"
