"""The controller's heart monitor: quick beats only while ranks are being admitted.

ipyparallel's hub lists an engine once the heart monitor has seen the engine's heart answer a
ping, so a short period makes a start quick; kept up for the cluster's life, on a loaded machine,
every late answer logged a warning ("missed a beat") and every stopped rank a line per beat. This
monitor pings every :data:`ADMISSION_MS` from the moment a heart connects until every heart that
connected has answered (at most :data:`ADMISSION_WINDOW` s), and every ``HeartMonitor.period``
otherwise. Any answer counts, however late (it was sent by a live heart); a heart fails after
``max_heartmonitor_misses`` periods of silence, whatever the pace. It runs in ipyparallel's heart
monitor process (``start_heartmonitor`` below is its target; see ``cluster/ipcontroller.py``).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import zmq
from ipyparallel.controller import heartmonitor as ipp_heartmonitor
from tornado import ioloop
from zmq.eventloop.zmqstream import ZMQStream

#: the pace while a heart that connected has not answered yet (an engine is admitted at its first answer)
ADMISSION_MS = 50
#: the longest a quick pace lasts after a heart connected (ipyparallel's registration timeout)
ADMISSION_WINDOW = 30.0
#: quick from the start for this long, in case a heart connected before its connection was watched
START_GRACE = 2.0


class AdmissionHeartMonitor(ipp_heartmonitor.HeartMonitor):  # type: ignore[misc]  # ipyparallel ships no types
    """ipyparallel's heart monitor, pinging quickly only while hearts wait to be admitted."""

    # the traits of ipyparallel's (untyped) HeartMonitor this monitor reads, as they are typed there
    period: int                    # ms between pings once admission is over
    max_heartmonitor_misses: int
    hearts: set[bytes]             # the hearts admitted
    responses: set[bytes]          # the hearts that answered since the last beat
    lifetime: float
    last_ping: float
    tic: float

    def start(self) -> None:
        self.seen: dict[bytes, float] = {}   # heart -> when it last answered
        self.waiting = 0                     # hearts that connected and have not answered yet
        now = time.monotonic()
        self.quick_until = self.grace_until = now + START_GRACE
        accepts = self.pong_stream.socket.get_monitor_socket(zmq.EVENT_ACCEPTED)
        self.log.debug("heartbeat::waiting for subscription")
        self.monitor_stream.socket.recv_multipart()
        self.pong_stream.on_recv(self.handle_pong)
        self.accepts = ZMQStream(accepts)
        self.accepts.on_recv(self.connected)
        self.tic = time.monotonic()
        self.caller = ioloop.PeriodicCallback(self.beat, ADMISSION_MS)
        self.caller.start()

    @property
    def silence_limit(self) -> float:
        """Seconds without an answer after which a heart has stopped."""
        return self.max_heartmonitor_misses * self.period / 1000

    def connected(self, _event: list[bytes]) -> None:
        """A heart connected to the pong socket: beat quickly until it has answered."""
        now = time.monotonic()
        self.waiting += 1
        self.quick_until = now + ADMISSION_WINDOW
        self.pace(now)

    def beat(self) -> None:
        self.pong_stream.flush()
        self.last_ping = self.lifetime
        now = time.monotonic()
        self.lifetime += now - self.tic
        self.tic = now
        for heart in self.responses:
            self.seen[heart] = now
        new = self.responses - self.hearts
        if new:
            self.handle_new_hearts(new)
            self.waiting = max(0, self.waiting - len(new))
        stopped = [h for h in self.hearts if now - self.seen.get(h, now) > self.silence_limit]
        if stopped:
            self.handle_heart_failure(stopped)
            for heart in stopped:
                self.seen.pop(heart, None)
        self.responses = set()
        self.ping_stream.send(str(self.lifetime).encode("ascii"))
        self.ping_stream.flush()
        self.pace(now)

    def pace(self, now: float) -> None:
        """Quick while a connected heart has not answered (or just after the start), else the period."""
        quick = (self.waiting > 0 and now < self.quick_until) or now < self.grace_until
        want = ADMISSION_MS if quick else self.period
        if self.caller.callback_time != want:
            self.caller.stop()
            self.caller.callback_time = want
            self.caller.start()

    def handle_pong(self, msg: list[bytes]) -> None:
        """A heart answered: any ping of ours it echoes shows it alive, however late."""
        try:
            answered = float(msg[1])
        except (IndexError, ValueError):
            self.log.debug("heartbeat::ignoring a malformed answer %r", msg[:2])
            return
        if answered <= self.lifetime:
            self.responses.add(msg[0])


def end_with_parent(poll: float = 0.2) -> threading.Thread:
    """End this process within ``poll`` s of its parent's death (it is then re-parented): the
    controller, SIGKILLed, left this process orphaned until the cluster's stop (issue 44 §4)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os._exit(0)   # nothing of it outlives the controller: no cleanup to wait for

    t = threading.Thread(target=watch, name="mlx-controller-watch", daemon=True)
    t.start()
    return t


def start_heartmonitor(**kwargs: Any) -> None:
    """ipyparallel's heart monitor process, with :class:`AdmissionHeartMonitor` as its monitor;
    it ends with the controller that forked it."""
    end_with_parent()
    ipp_heartmonitor.HeartMonitor = AdmissionHeartMonitor  # this process only: it is ours
    ipp_heartmonitor.start_heartmonitor(**kwargs)
