"""Deliver ZMQ messages left sitting in a socket that its ZMQStream no longer watches.

A ZMQ socket's FD is edge-triggered: when anything other than the stream's own
handler takes the edge (reading ``EVENTS``, a send from elsewhere), messages that
arrived meanwhile stay queued while the event loop sleeps, and a request is never
handled: a cell that never starts on a rank, a reply the notebook never reads.
Our own client once did this (a raw send beside the stream: cells hung for good);
ipyparallel and ipykernel touch their sockets from several places, so a cheap
guard stays: a look every quarter second, in the stream's own loop, costs one
getsockopt and hands any queued message to the stream. Reading ``EVENTS`` takes
the edge too, which is why a look that sees input always flushes at once.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

PERIOD = 0.25  # seconds between looks


def watch_queues(streams: Iterable[Any], on_kick: Optional[Callable[[Any], None]] = None,
                 period: float = PERIOD) -> None:
    """Start a watch on each stream, in that stream's IO loop (callable from any thread)."""
    for stream in streams:
        if stream is not None:
            stream.io_loop.add_callback(_start, stream, on_kick, period)


def _start(stream: Any, on_kick: Optional[Callable[[Any], None]], period: float) -> None:
    import zmq
    from tornado.ioloop import PeriodicCallback

    def look() -> None:
        if stream.closed():
            checker.stop()
            return
        if not stream.receiving():  # flush() would drop what no callback takes
            return
        try:
            waiting = stream.socket.get(zmq.EVENTS) & zmq.POLLIN
        except zmq.ZMQError:  # closed under us
            checker.stop()
            return
        if waiting:
            stream.flush(zmq.POLLIN)
            if on_kick is not None:
                on_kick(stream)

    checker = PeriodicCallback(look, period * 1000)
    checker.start()
