"""zmqwatch hands a ZMQStream the messages left in its socket after its FD's edge was taken."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import zmq
from tornado.ioloop import IOLoop
from zmq.eventloop.zmqstream import ZMQStream

from mlx_jupyter.cluster.shared.zmqwatch import watch_queues

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def loop_and_pair():
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    port = a.bind_to_random_port("tcp://127.0.0.1")
    b.connect(f"tcp://127.0.0.1:{port}")
    ready = threading.Event()
    box = {}

    def run() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        box["loop"] = IOLoop.current()
        ready.set()
        box["loop"].start()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    assert ready.wait(5)
    loop = box["loop"]
    yield loop, a, b
    loop.add_callback(loop.stop)
    t.join(5)
    a.close(0)
    b.close(0)
    ctx.term()


def _stream_missing_its_edge(loop, sock, peer, got: list, arrived: threading.Event, watch: bool) -> None:
    """A stream on ``sock`` whose FD edge is taken (EVENTS read elsewhere) as a message arrives."""
    made = threading.Event()

    def make() -> None:
        stream = ZMQStream(sock, loop)
        stream.on_recv(lambda msg: (got.append(msg), arrived.set()))
        if watch:
            watch_queues([stream])
        made.set()

    loop.add_callback(make)
    assert made.wait(5)
    taken = threading.Event()

    def take_the_edge() -> None:  # in the loop's thread, before the stream sees the message
        peer.send(b"hello")
        deadline = time.monotonic() + 5
        while not (sock.get(zmq.EVENTS) & zmq.POLLIN) and time.monotonic() < deadline:
            time.sleep(0.001)
        taken.set()

    loop.add_callback(take_the_edge)
    assert taken.wait(10)


def test_without_the_watch_the_message_stays_unread(loop_and_pair):
    loop, a, b = loop_and_pair
    got, arrived = [], threading.Event()
    _stream_missing_its_edge(loop, a, b, got, arrived, watch=False)
    assert not arrived.wait(1.0), "the scenario did not lose the edge; the test proves nothing"


def test_the_watch_delivers_it(loop_and_pair):
    loop, a, b = loop_and_pair
    got, arrived = [], threading.Event()
    _stream_missing_its_edge(loop, a, b, got, arrived, watch=True)
    assert arrived.wait(2.0)
    assert got == [[b"hello"]]
