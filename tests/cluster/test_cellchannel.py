"""The direct cell channel without engines: its signed frames, the notebook's hub and a rank's
end (over real ZMQ sockets on loopback, with a stand-in kernel)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st
from jupyter_client.session import Session
from tornado.platform.asyncio import AsyncIOLoop

from mlx_jupyter.cluster.cells import wire as cellwire
from mlx_jupyter.cluster.cells.hub import CellHub
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


# ---------------------------------------------------------------- the hub


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


@pytest.fixture
def hub():
    h = CellHub("127.0.0.1").start(session())
    yield h
    h.close()


def _dealer(port: int, identity: bytes) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, identity)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def test_hub_sends_a_cell_to_the_rank_that_said_hello_and_hands_back_its_output_then_reply(hub):
    s = session()
    rank = _dealer(hub.port, b"rank3-1")
    try:
        rank.send_multipart(cellwire.encode(s, {"t": "hello", "rank": 3, "pid": 1}))
        assert hub.wait_connected([3], 5) == []
        sink = Sink()
        pending = hub.send_cell(3, "m1", "print(1)", sink)
        assert rank.poll(5000)
        cell = cellwire.decode(s, rank.recv_multipart())
        assert cell == {"t": "cell", "id": "m1", "code": "print(1)"} and not pending.done()
        rank.send_multipart(cellwire.encode(s, {"t": "out", "id": "m1", "kind": "stream",
                                                "content": {"name": "stdout", "text": "1\n"}}))
        rank.send_multipart(cellwire.encode(s, {"t": "reply", "id": "m1", "content": {"status": "ok"}}))
        assert sink.replied.wait(5) and pending.done()
        assert sink.outputs == [(3, "stream", {"name": "stdout", "text": "1\n"})]
        assert sink.replies == [(3, {"status": "ok"})]
    finally:
        rank.close()


def test_hub_drops_what_is_not_signed_with_the_clusters_key(hub):
    rogue = _dealer(hub.port, b"rogue")
    try:
        rogue.send_multipart(cellwire.encode(session(b"guess"), {"t": "hello", "rank": 0, "pid": 1}))
        deadline = time.monotonic() + 5
        while hub.dropped == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hub.dropped == 1 and not hub.connected([0])
    finally:
        rogue.close()


def test_a_cell_for_a_rank_not_on_the_channel_ends_at_once_saying_so(hub):
    sink = Sink()
    pending = hub.send_cell(5, "m2", "x = 1", sink)
    assert pending.done() and sink.replies[0][1]["ename"] == "ChannelError"
    assert "rank 5 is not connected" in sink.replies[0][1]["evalue"]


def test_forgetting_a_rank_ends_its_pending_cells(hub):
    s = session()
    rank = _dealer(hub.port, b"rank0-9")
    try:
        rank.send_multipart(cellwire.encode(s, {"t": "hello", "rank": 0, "pid": 9}))
        assert hub.wait_connected([0], 5) == []
        pending = hub.send_cell(0, "m3", "import time; time.sleep(100)", Sink())
        hub.forget([0])
        assert pending.done() and not hub.connected([0])
    finally:
        rank.close()


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


def open_channel(kernel: FakeKernel, rank: int, port: int) -> RecordingChannel:
    """A rank's channel made on the loop's thread, which owns its cells socket (as in an engine)."""
    return kernel.on_loop(lambda: RecordingChannel(kernel, rank, f"tcp://127.0.0.1:{port}"))


@pytest.fixture
def notebook_end():
    sock = zmq.Context.instance().socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield sock, port
    sock.close()


def _recv(sock: zmq.Socket) -> tuple[bytes, dict]:
    assert sock.poll(5000), "nothing came from the rank"
    ident, *frames = sock.recv_multipart()
    return ident, cellwire.decode(session(), frames)


def test_rank_says_hello_runs_each_signed_cell_once_and_drops_the_rest(notebook_end):
    sock, port = notebook_end
    kernel = FakeKernel()
    channel = open_channel(kernel, 1, port)
    try:
        ident, hello = _recv(sock)
        assert hello["t"] == "hello" and hello["rank"] == 1 and ident.startswith(b"rank1-")
        sock.send_multipart([ident] + cellwire.encode(session(b"guess"), {"t": "cell", "id": "x", "code": "1"}))
        good = cellwire.encode(session(), {"t": "cell", "id": "c1", "code": "y = 2"})
        sock.send_multipart([ident] + good)
        sock.send_multipart([ident] + good)  # replayed
        sock.send_multipart([ident] + cellwire.encode(session(), {"t": "cell", "id": "c2", "code": "z = 3"}))
        deadline = time.monotonic() + 5  # in order on one socket: once c2 is in, the others were seen
        while len(channel.ran) < 2 and time.monotonic() < deadline:
            channel.ran_event.wait(0.05)
            channel.ran_event.clear()
        assert [msg["id"] for msg in channel.ran] == ["c1", "c2"]
    finally:
        kernel.on_loop(channel.close)
        kernel.close()


def test_rank_sends_its_channel_cells_outputs_to_the_notebook_and_the_rest_to_iopub(notebook_end):
    sock, port = notebook_end
    kernel = FakeKernel()
    channel = open_channel(kernel, 0, port)
    try:
        _recv(sock)  # hello
        ours = {"msg_id": "c9", "session": cellwire.CHANNEL_SESSION}
        msg = {"header": {"msg_type": "stream"}, "parent_header": ours, "content": {"name": "stdout", "text": "hi"}}
        kernel.session.send("iopub", msg)
        kernel.session.send("iopub", "status", {"execution_state": "busy"}, {"header": ours})
        other = {"header": {"msg_type": "stream"}, "parent_header": {"msg_id": "p", "session": "client"},
                 "content": {"name": "stdout", "text": "px"}}
        kernel.session.send("iopub", other)
        last = {"header": {"msg_type": "display_data"}, "parent_header": ours, "content": {"data": {}}}
        kernel.session.send("iopub", last)
        _, out = _recv(sock)
        assert out == {"t": "out", "id": "c9", "kind": "stream", "content": {"name": "stdout", "text": "hi"}}
        _, out = _recv(sock)  # next: the display, not the status
        assert out["kind"] == "display_data"
        assert [m for m, _c, _p in kernel.sent] == [other]
    finally:
        kernel.on_loop(channel.close)
        kernel.close()
