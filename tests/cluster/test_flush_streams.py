"""A rank's cell reply waits for the cell's stream output, and only when there is some; the notebook
kernel's reply after a distributed cell skips ipykernel's flushes and sleep, never an output
(ipykernel's real ``OutStream`` and IOPub thread; the session's sends are recorded)."""

from __future__ import annotations

import threading

import pytest
import zmq
from ipykernel.iostream import IOPubThread, OutStream
from jupyter_client.session import Session

from mlx_jupyter.cluster.shared.kernel_streams import flush_streams

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


def waits_for_text_being_sent(streams, flush) -> None:
    """``flush()`` does not return while the IOPub thread's flush has taken the text (nothing pending,
    buffer empty) but not sent it yet, and returns once it is sent."""
    streams.release.clear()
    streams.out.write("late\n")
    streams.pub.schedule(streams.out._flush)
    assert streams.sending.wait(5)
    assert not streams.out._flush_pending and not streams.out._buffers
    returned = threading.Event()
    waiter = threading.Thread(target=lambda: (flush(), returned.set()))
    waiter.start()
    assert not returned.wait(0.3), "the flush returned while the text was still being sent"
    streams.release.set()
    assert returned.wait(5)
    assert streams.sent == ["late\n"]
    waiter.join(5)


def test_a_flush_still_sending_is_waited_for(streams):
    flush_streams([streams.out, streams.err])
    waits_for_text_being_sent(streams, lambda: flush_streams([streams.out, streams.err]))


def test_streams_that_are_not_ipykernels_are_flushed_as_usual(streams, capsys):
    import io

    other = io.StringIO()
    other.flush = lambda: other.write("flushed")
    flush_streams([other])
    assert other.getvalue() == "flushed"


# ---------------------------------------------------------------- the notebook kernel's tail (reply_tail)

class _Kernel:
    _execute_sleep = 0.0005


class _Shell:
    """What reply_tail reads of IPython's shell: its kernel and its events."""

    def __init__(self, kernel):
        from IPython.core.events import EventManager, available_events

        self.kernel = kernel
        self.events = EventManager(self, available_events)


@pytest.fixture
def kernel_streams(streams):
    """``streams``, and a shell whose kernel has a tail (the skip is given the streams as the kernel's stdout and stderr)."""
    return streams, _Shell(_Kernel())


def skip(streams, shell) -> bool:
    from mlx_jupyter.cluster.cells import reply_tail

    return reply_tail.skip_for_this_request(shell, [streams.out, streams.err])


def test_the_tail_skipped_costs_no_round_trip_until_the_next_cell(kernel_streams):
    streams, shell = kernel_streams
    assert skip(streams, shell)
    assert shell.kernel._execute_sleep == 0.0
    before = streams.scheduled
    streams.out.flush()
    streams.err.flush()
    assert streams.scheduled == before
    shell.events.trigger("pre_execute")   # the next cell
    assert shell.kernel._execute_sleep == 0.0005
    streams.out.flush()
    assert streams.scheduled > before   # ipykernel's own flush again


def test_the_skip_still_sends_what_the_cell_printed(kernel_streams):
    streams, shell = kernel_streams
    streams.out.write("printed by the cell\n")
    assert skip(streams, shell)
    assert streams.sent == ["printed by the cell\n"]
    streams.err.write("printed after the magic\n")   # e.g. by a post_run_cell hook
    streams.err.flush()
    assert streams.sent[-1] == "printed after the magic\n"


def test_while_skipped_a_flush_still_sending_is_waited_for(kernel_streams):
    streams, shell = kernel_streams
    assert skip(streams, shell)
    waits_for_text_being_sent(streams, streams.out.flush)


def test_the_first_skip_waits_for_a_flush_begun_before_flushes_were_counted(kernel_streams):
    streams, shell = kernel_streams
    waits_for_text_being_sent(streams, lambda: skip(streams, shell))


def test_a_sleep_changed_meanwhile_stands(kernel_streams):
    streams, shell = kernel_streams
    assert skip(streams, shell)
    shell.kernel._execute_sleep = 0.25
    shell.events.trigger("pre_execute")
    assert shell.kernel._execute_sleep == 0.25
    assert skip(streams, shell) and skip(streams, shell)   # twice: one saved value
    shell.events.trigger("pre_execute")
    assert shell.kernel._execute_sleep == 0.25


def test_outside_an_ipykernel_nothing_changes(streams):
    import io

    from mlx_jupyter.cluster.cells import reply_tail

    assert not skip(streams, _Shell(None))   # a terminal IPython: no kernel
    shell, other = _Shell(_Kernel()), io.StringIO()
    flush = other.flush
    assert not reply_tail.skip_for_this_request(shell, [other, streams.err])   # not ipykernel's streams
    assert shell.kernel._execute_sleep == 0.0005 and other.flush == flush and "flush" not in vars(streams.err)
