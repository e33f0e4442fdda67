"""The direct cell channel without engines: its signed frames, the notebook's cell server and a rank's
end (over real ZMQ sockets on loopback, with a stand-in kernel)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jupyter_client.session import Session
from tornado.platform.asyncio import AsyncIOLoop

from mlx_jupyter.cluster.shared import wire as cellwire
from mlx_jupyter.cluster.cells import cell_server as hubmod
from mlx_jupyter.cluster.cells.cell_server import CellServer
from mlx_jupyter.cluster.rank.channel import RankChannel

pytestmark = pytest.mark.timeout(30)

KEY = b"the-cluster-key"


def session(key: bytes = KEY) -> Session:
    return Session(key=key)


# ---------------------------------------------------------------- frames


def test_frames_round_trip_and_carry_a_signature():
    s = session()
    frames = cellwire.encode(s, {"t": "cell", "id": "a", "code": "x = 1"})
    assert len(frames) == 2 and frames[0] == s.sign([frames[1]]) and frames[0]
    assert cellwire.decode(s, frames) == {"t": "cell", "id": "a", "code": "x = 1"}


@pytest.mark.parametrize("frames, says", [
    ([b"sig"], "expected 2 frames"),
    ([b"0" * 64, b'{"t": "cell"}'], "bad signature"),
])
def test_bad_frames_are_named(frames, says):
    with pytest.raises(cellwire.WireError, match=says):
        cellwire.decode(session(), frames)


def test_a_message_signed_with_another_key_is_refused():
    frames = cellwire.encode(session(b"another key"), {"t": "cell", "id": "a", "code": "import os"})
    with pytest.raises(cellwire.WireError, match="bad signature"):
        cellwire.decode(session(), frames)


def test_a_signed_payload_that_is_no_message_is_refused():
    s = session()
    for payload in (b"not json", b"[1, 2]", b'{"id": 1}'):
        with pytest.raises(cellwire.WireError):
            cellwire.decode(s, [s.sign([payload]), payload])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=4), st.booleans())
def test_decode_of_any_frames_returns_a_message_or_raises_wire_error(frames, signed):
    s = session()
    if signed and len(frames) == 2:
        frames = [s.sign([frames[1]]), frames[1]]
    try:
        msg = cellwire.decode(s, frames)
    except cellwire.WireError:
        return
    assert isinstance(msg, dict) and isinstance(msg["t"], str)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=80), st.binary(max_size=300)), max_size=6),
       st.lists(st.integers(min_value=1, max_value=50), min_size=1, max_size=20))
def test_frames_come_back_whole_from_any_chunking(pairs, cuts):
    stream = b"".join(cellwire.frame(list(p)) for p in pairs)
    reader, got, i, k = cellwire.FrameReader(), [], 0, 0
    while i < len(stream):
        n = cuts[k % len(cuts)]
        got += reader.feed(stream[i:i + n])
        i, k = i + n, k + 1
    assert got == [list(p) for p in pairs] and reader.buffered == 0


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_give_pairs_or_wire_error_and_never_more_than_the_limit(data):
    reader = cellwire.FrameReader(max_payload=64)
    try:
        pairs = reader.feed(data)
    except cellwire.WireError:
        return
    assert all(len(sig) <= cellwire.MAX_SIGNATURE and len(payload) <= 64 for sig, payload in pairs)


def test_a_frame_longer_than_the_limit_is_refused_from_its_header():
    header = cellwire.HEADER.pack(64, 1 << 31)
    with pytest.raises(cellwire.WireError, match="exceed the limits"):
        cellwire.FrameReader().feed(header)


# ---------------------------------------------------------------- the cell server


class Sink:
    def __init__(self):
        self.outputs: list = []
        self.replies: list = []
        self.replied = threading.Event()

    def channel_output(self, rank, kind, content):
        self.outputs.append((rank, kind, content))

    def channel_reply(self, rank, content):
        self.replies.append((rank, content))
        self.replied.set()


class Peer:
    """One end of a channel connection, driven by the test: blocking, with a deadline on every read."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.reader = cellwire.FrameReader()
        self.pairs: list = []

    @classmethod
    def dial(cls, port: int) -> "Peer":
        return cls(socket.create_connection(("127.0.0.1", port), timeout=5))

    def send(self, obj: dict, s: Session | None = None) -> None:
        self.sock.sendall(cellwire.frame(cellwire.encode(s or session(), obj)))

    def recv(self, timeout: float = 5.0) -> dict:
        deadline = time.monotonic() + timeout
        while not self.pairs:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(65536)
            assert data, "the connection was closed"
            self.pairs += self.reader.feed(data)
        return cellwire.decode(session(), self.pairs.pop(0))

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """Whether the other end closed the connection within ``timeout`` s (what it sent is skipped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                if not self.sock.recv(65536):
                    return True
            except socket.timeout:
                return False
            except ConnectionResetError:
                return True
        return False

    def close(self):
        self.sock.close()


@pytest.fixture
def cell_server():
    h = CellServer("127.0.0.1").start(session())
    yield h
    h.close()


def _hello(cell_server: CellServer, rank: int, pid: int = 1) -> Peer:
    """A rank's connection, once the cell server has taken its hello (this one: a rank may say it again)."""
    peer = Peer.dial(cell_server.port)
    peer.send({"t": "hello", "rank": rank, "pid": pid})
    with cell_server._hello:
        assert cell_server._hello.wait_for(lambda: cell_server.pids.get(rank) == pid, 5), f"no hello from rank {rank} pid {pid}"
    return peer


def test_hub_sends_a_cell_to_the_rank_that_said_hello_and_hands_back_its_output_then_reply(cell_server):
    rank = _hello(cell_server, 3)
    try:
        sink = Sink()
        pending = cell_server.send_cell(3, "m1", "print(1)", sink)
        assert rank.recv() == {"t": "cell", "id": "m1", "code": "print(1)"} and not pending.done()
        rank.send({"t": "out", "id": "m1", "kind": "stream", "content": {"name": "stdout", "text": "1\n"}})
        rank.send({"t": "reply", "id": "m1", "content": {"status": "ok"}})
        assert sink.replied.wait(5) and pending.done()
        assert sink.outputs == [(3, "stream", {"name": "stdout", "text": "1\n"})]
        assert sink.replies == [(3, {"status": "ok"})]
        assert cell_server.pids[3] == 1
    finally:
        rank.close()


def _unread_hub_with_rank(rank: int) -> tuple[CellServer, Peer]:
    """A cell server whose own thread never runs (only a reader's pump can read), with ``rank`` connected."""
    from mlx_jupyter.cluster.shared.transport import tune

    h = CellServer("127.0.0.1")
    h.session = session()
    peer = Peer.dial(h.port)
    h.listener.setblocking(True)
    sock, _ = h.listener.accept()
    conn = hubmod.Connection(tune(sock))
    conn.rank, conn.reader.max_payload = rank, cellwire.MAX_PAYLOAD
    h.idents[rank] = conn
    return h, peer


def test_the_thread_waiting_for_a_cell_reads_its_reply_itself():
    """CellRun.next_event pumps the ranks' connections: the reply reaches the sink on the waiting
    thread, with no hand-over from the server's thread (here it does not even run)."""
    h, peer = _unread_hub_with_rank(3)
    try:
        got = []

        class ThreadSink(Sink):
            def channel_reply(self, rank, content):
                got.append(threading.current_thread())
                super().channel_reply(rank, content)

        sink = ThreadSink()
        h.send_cell(3, "m1", "x = 1", sink)
        assert peer.recv()["id"] == "m1"
        peer.send({"t": "out", "id": "m1", "kind": "stream", "content": {"name": "stdout", "text": "1\n"}})
        peer.send({"t": "reply", "id": "m1", "content": {"status": "ok"}})
        deadline = time.monotonic() + 10
        while not sink.replied.is_set() and time.monotonic() < deadline:
            assert h.pump([3], 1.0)
        assert sink.replies == [(3, {"status": "ok"})] and got == [threading.current_thread()]
        assert sink.outputs == [(3, "stream", {"name": "stdout", "text": "1\n"})]
        assert h.pump([3], 0.01)  # nothing more: it waited, and read nothing
        peer.close()
        assert not h.pump([3], 5.0)  # the connection ended: left to the server's thread, the caller waits its own way
        assert not h.pump([7], 0.01)  # no connection to wait on
    finally:
        peer.close()
        for conn in h.idents.values():
            conn.sock.close()
        h.close()


def test_hub_closes_a_connection_that_sends_what_is_not_signed_with_the_clusters_key(cell_server):
    rogue = Peer.dial(cell_server.port)
    try:
        rogue.send({"t": "hello", "rank": 0, "pid": 1}, session(b"guess"))
        assert rogue.closed_by_peer()
        assert cell_server.dropped == 1 and not cell_server.connected([0])
    finally:
        rogue.close()


def test_hub_closes_a_stranger_that_announces_a_huge_message_before_its_hello(cell_server):
    rogue = Peer.dial(cell_server.port)
    try:
        rogue.sock.sendall(cellwire.HEADER.pack(64, hubmod.MAX_HELLO + 1))
        assert rogue.closed_by_peer()
    finally:
        rogue.close()


def test_hub_closes_strangers_that_stay_silent(cell_server, monkeypatch):
    monkeypatch.setattr(hubmod, "HELLO_TIMEOUT", 0.2)
    monkeypatch.setattr(hubmod, "MAX_UNKNOWN", 3)
    silent = [Peer.dial(cell_server.port) for _ in range(5)]
    try:
        rank = _hello(cell_server, 2)  # a rank gets through meanwhile
        assert silent[0].closed_by_peer(), "the oldest silent connection was kept beyond the limit"
        assert all(p.closed_by_peer() for p in silent[1:]), "a silent connection outlived HELLO_TIMEOUT"
        cell_server.send_cell(2, "m5", "x = 1", Sink())
        assert rank.recv()["id"] == "m5"
        rank.close()
    finally:
        for p in silent:
            p.close()


def test_a_cell_for_a_rank_not_on_the_channel_ends_at_once_saying_so(cell_server):
    sink = Sink()
    pending = cell_server.send_cell(5, "m2", "x = 1", sink)
    assert pending.done() and sink.replies[0][1]["ename"] == "ChannelError"
    assert "rank 5 is not connected" in sink.replies[0][1]["evalue"]


def test_forgetting_a_rank_ends_its_pending_cells(cell_server):
    rank = _hello(cell_server, 0, pid=9)
    try:
        pending = cell_server.send_cell(0, "m3", "import time; time.sleep(100)", Sink())
        cell_server.forget([0])
        assert pending.done() and not cell_server.connected([0])
    finally:
        rank.close()


def test_a_cell_whose_rank_connection_breaks_ends_after_the_grace_saying_so(cell_server, monkeypatch):
    monkeypatch.setattr(hubmod, "LOST_GRACE", 0.2)
    rank = _hello(cell_server, 1)
    sink = Sink()
    cell_server.send_cell(1, "m6", "import time; time.sleep(100)", sink)
    assert rank.recv()["id"] == "m6"
    rank.close()
    assert sink.replied.wait(5), "the cell never ended"
    assert sink.replies[0][1]["ename"] == "ChannelError" and "connection to rank 1 was lost" in sink.replies[0][1]["evalue"]
    assert not cell_server.connected([1])


def test_a_rank_that_connects_again_gets_the_next_cells_on_its_new_connection(cell_server):
    old = _hello(cell_server, 4, pid=1)
    new = _hello(cell_server, 4, pid=2)
    try:
        cell_server.send_cell(4, "m7", "x = 1", Sink())
        assert new.recv()["id"] == "m7" and cell_server.pids[4] == 2
        old.close()  # the old one ending does not forget the rank
        cell_server.send_cell(4, "m8", "x = 2", Sink())
        assert new.recv()["id"] == "m8" and cell_server.connected([4])
    finally:
        new.close()


# ---------------------------------------------------------------- a rank's end


class FakeKernel:
    """A session whose sends are recorded, and a real loop (tornado's, on its own thread)."""

    def __init__(self):
        self.session = session()
        self.sent: list = []
        self.session.send = lambda stream, msg_or_type, content=None, parent=None, *a, **k: \
            self.sent.append((msg_or_type, content, parent))
        self._asyncio = asyncio.new_event_loop()
        self.io_loop = AsyncIOLoop(asyncio_loop=self._asyncio)
        self._thread = threading.Thread(target=self._asyncio.run_forever, daemon=True)
        self._thread.start()

    def on_loop(self, fn):
        """``fn()`` run on the loop's thread; its result."""
        return asyncio.run_coroutine_threadsafe(_call(fn), self._asyncio).result(5)

    def close(self):
        self._asyncio.call_soon_threadsafe(self._asyncio.stop)
        self._thread.join(5)


async def _call(fn):
    return fn()


class RecordingChannel(RankChannel):
    """Records the cells it would run instead of running them."""

    def __init__(self, *args):
        self.ran: list = []
        self.ran_event = threading.Event()
        super().__init__(*args)

    async def _execute(self, msg):
        self.ran.append(msg)
        self.ran_event.set()


@contextlib.contextmanager
def rank_channel(rank: int, port: int, *args):
    """A rank's channel made on a loop's thread (as in an engine), and closed there at the end."""
    kernel = FakeKernel()
    channel = kernel.on_loop(lambda: RecordingChannel(kernel, rank, f"tcp://127.0.0.1:{port}", *args))
    try:
        yield kernel, channel
    finally:
        kernel.on_loop(channel.close)
        kernel.close()


class NotebookEnd:
    """A listener standing in for the cell server: :meth:`accept` gives the rank's connection as a Peer."""

    def __init__(self, port: int = 0):
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]

    def accept(self, timeout: float = 5.0) -> Peer:
        self.listener.settimeout(timeout)
        sock, _ = self.listener.accept()
        return Peer(sock)

    def close(self):
        self.listener.close()


@pytest.fixture
def notebook_end():
    end = NotebookEnd()
    yield end
    end.close()


def test_rank_says_hello_runs_each_signed_cell_once_and_drops_the_rest(notebook_end):
    with rank_channel(1, notebook_end.port) as (kernel, channel):
        peer = notebook_end.accept()
        hello = peer.recv()
        assert hello["t"] == "hello" and hello["rank"] == 1 and hello["pid"] == os.getpid()
        peer.send({"t": "cell", "id": "x", "code": "1"}, session(b"guess"))
        good = cellwire.frame(cellwire.encode(session(), {"t": "cell", "id": "c1", "code": "y = 2"}))
        peer.sock.sendall(good[:5])  # a message split across reads
        peer.sock.sendall(good[5:] + good)  # and replayed
        peer.send({"t": "cell", "id": "c2", "code": "z = 3"})
        deadline = time.monotonic() + 5  # in order on one socket: once c2 is in, the others were seen
        while len(channel.ran) < 2 and time.monotonic() < deadline:
            channel.ran_event.wait(0.05)
            channel.ran_event.clear()
        assert [msg["id"] for msg in channel.ran] == ["c1", "c2"]


def test_rank_sends_its_channel_cells_outputs_to_the_notebook_and_the_rest_to_iopub(notebook_end):
    with rank_channel(0, notebook_end.port) as (kernel, channel):
        peer = notebook_end.accept()
        peer.recv()  # hello
        assert channel.connected.wait(5)
        ours = {"msg_id": "c9", "session": cellwire.CHANNEL_SESSION}
        msg = {"header": {"msg_type": "stream"}, "parent_header": ours, "content": {"name": "stdout", "text": "hi"}}
        kernel.session.send("iopub", msg)
        kernel.session.send("iopub", "status", {"execution_state": "busy"}, {"header": ours})
        other = {"header": {"msg_type": "stream"}, "parent_header": {"msg_id": "p", "session": "client"},
                 "content": {"name": "stdout", "text": "px"}}
        kernel.session.send("iopub", other)
        last = {"header": {"msg_type": "display_data"}, "parent_header": ours, "content": {"data": {}}}
        kernel.session.send("iopub", last)
        out = peer.recv()
        assert out == {"t": "out", "id": "c9", "kind": "stream", "content": {"name": "stdout", "text": "hi"}}
        out = peer.recv()  # next: the display, not the status
        assert out["kind"] == "display_data"
        assert [m for m, _c, _p in kernel.sent] == [other]


def test_rank_dials_until_the_notebook_listens(notebook_end):
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there now
    with rank_channel(2, port) as (kernel, channel):
        later = NotebookEnd(port)
        try:
            peer = later.accept()
            assert peer.recv()["t"] == "hello"
            assert channel.connected.wait(5)
            peer.close()
        finally:
            later.close()


def test_rank_whose_notebook_closes_the_connection_says_why_and_drops_later_output(notebook_end):
    with rank_channel(0, notebook_end.port) as (kernel, channel):
        peer = notebook_end.accept()
        peer.recv()
        assert channel.connected.wait(5)
        peer.close()
        deadline = time.monotonic() + 5
        while channel.connected.is_set() and time.monotonic() < deadline:
            channel.connected.wait(0.01)  # cleared by the loop when it reads the end
            time.sleep(0.01)
        assert not channel.connected.is_set() and "closed the connection" in channel.error
        channel.post({"t": "reply", "id": "gone", "content": {"status": "ok"}})  # dropped, no exception


def test_rank_that_cannot_reach_the_notebook_says_so():
    free = socket.create_server(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()
    with rank_channel(0, port, 0.3) as (kernel, channel):
        deadline = time.monotonic() + 5
        while not channel.error and time.monotonic() < deadline:
            time.sleep(0.02)
        assert f"could not connect to the notebook's cell channel at tcp://127.0.0.1:{port}" in channel.error
        assert not channel.connected.is_set()


def test_hub_on_every_interface_is_reached_on_loopback():
    h = CellServer("*").start(session())
    try:
        peer = Peer.dial(h.port)
        peer.send({"t": "hello", "rank": 0, "pid": 1})
        assert h.wait_connected([0], 5) == []
        peer.close()
    finally:
        h.close()


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    from mlx_jupyter.cluster.shared.transport import tune

    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname(), timeout=5)
        b, _ = listener.accept()
    return tune(a), b


def test_a_small_message_is_written_whole_without_releasing_the_gil_and_a_large_one_in_the_end_too():
    """Writer.send_small: a cell's message goes out at once (the GIL kept: no other thread runs between
    two ranks' cells); what the socket cannot take at once goes the usual way; a closed peer breaks it."""
    from mlx_jupyter.cluster.shared.transport import Writer, send_at_once

    a, b = _tcp_pair()
    try:
        w = Writer(a)
        assert w.send_small(b"cell") and b.recv(16) == b"cell"
        if hasattr(socket, "MSG_DONTWAIT"):
            assert send_at_once(a, b"x" * 10) == 10 and b.recv(16) == b"x" * 10
        big = os.urandom(16 << 20)  # more than the socket buffers hold: the rest waits for the reader
        got = bytearray()
        reader = threading.Thread(target=lambda: [got.extend(b.recv(1 << 20)) for _ in iter(lambda: len(got) < len(big), False)])
        reader.start()
        assert w.send_small(big)
        reader.join(30)
        assert bytes(got) == big
        b.close()
        results = [w.send_small(b"y" * 65536) for _ in range(50)]  # the first may go before the peer's reset
        assert False in results and w.broken, results
        assert not w.send_small(b"z")
    finally:
        a.close()
        b.close()
