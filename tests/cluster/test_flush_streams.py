"""A rank's cell reply waits for the cell's stream output, and only when there is some
(ipykernel's real ``OutStream`` and IOPub thread; the session's sends are recorded)."""

from __future__ import annotations

import threading

import pytest
import zmq
from ipykernel.iostream import IOPubThread, OutStream
from jupyter_client.session import Session

from mlx_jupyter.cluster.rank.kernel_compat import flush_streams

pytestmark = pytest.mark.timeout(30)


class Streams:
    """stdout and stderr as in an engine, on one IOPub thread; what they send is in ``sent``."""

    def __init__(self, pub: IOPubThread):
        self.sent: list[str] = []
        self.release = threading.Event()
        self.release.set()
        self.sending = threading.Event()
        self.session = Session(key=b"k")
        self.session.send = self._send
        self.pub = pub
        self.out = OutStream(self.session, self.pub, "stdout", watchfd=False)
        self.err = OutStream(self.session, self.pub, "stderr", watchfd=False)
        self.scheduled = 0
        original = type(pub).schedule

        def schedule(fn):
            self.scheduled += 1
            original(pub, fn)

        pub.schedule = schedule

    def _send(self, stream, msg, *args, **kwargs):
        self.sending.set()
        assert self.release.wait(10)
        self.sent.append(msg["content"]["text"])

    def close(self):
        self.release.set()
        del self.pub.schedule


@pytest.fixture(scope="module")
def iopub():
    """One IOPub thread for the module (ipykernel's stop leaves a task behind, which warns at exit)."""
    socket = zmq.Context.instance().socket(zmq.PUB)
    pub = IOPubThread(socket)
    pub.start()
    yield pub
    pub.stop()
    socket.close(linger=0)


@pytest.fixture
def streams(iopub):
    s = Streams(iopub)
    yield s
    s.close()


def test_a_cell_without_output_costs_no_round_trip(streams):
    flush_streams([streams.out, streams.err])  # the first call starts counting flushes
    before = streams.scheduled
    for _ in range(5):
        flush_streams([streams.out, streams.err])
    assert streams.scheduled == before


def test_text_written_is_sent_before_flush_returns(streams):
    flush_streams([streams.out, streams.err])
    streams.out.write("to stdout\n")
    streams.err.write("to stderr\n")
    flush_streams([streams.out, streams.err])
    assert sorted(streams.sent) == ["to stderr\n", "to stdout\n"]


def test_a_flush_still_sending_is_waited_for(streams):
    """The interval flush has taken the text (nothing pending, buffer empty) but not sent it yet."""
    flush_streams([streams.out, streams.err])
    streams.release.clear()
    streams.out.write("late\n")
    streams.pub.schedule(streams.out._flush)
    assert streams.sending.wait(5)
    assert not streams.out._flush_pending and not streams.out._buffers
    returned = threading.Event()
    waiter = threading.Thread(target=lambda: (flush_streams([streams.out, streams.err]), returned.set()))
    waiter.start()
    assert not returned.wait(0.3), "flush_streams returned while the text was still being sent"
    streams.release.set()
    assert returned.wait(5)
    assert streams.sent == ["late\n"]
    waiter.join(5)


def test_streams_that_are_not_ipykernels_are_flushed_as_usual(streams, capsys):
    import io

    other = io.StringIO()
    other.flush = lambda: other.write("flushed")
    flush_streams([other])
    assert other.getvalue() == "flushed"
