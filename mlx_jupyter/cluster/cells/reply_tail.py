"""The notebook kernel's tail after a distributed cell, cut to what that cell needs.

After every cell, before its reply, ipykernel flushes stdout and stderr (a round trip to its IOPub
thread each, even when they are empty) and sleeps ``Kernel._execute_sleep`` (0.5 ms, a FIXME
kept from ipykernel 4). Together that is 1.5 ms of a 10 ms distributed cell, whose output is
already sent when the magic returns. :func:`skip_for_this_request` flushes what the cell left
and skips both for the request running now only: the next cell (``pre_execute``) gets them back.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from mlx_jupyter.cluster.shared.kernel_streams import flush_streams, has_output, is_kernel_stream, track_flushes


class _Tail:
    """The state of one kernel's tail: whether the running request skips it, and the sleep to put back."""

    def __init__(self, kernel: Any):
        self.kernel = kernel
        self.armed = False
        self.sleep: Any = None   # the kernel's own _execute_sleep while it is set to 0

    def arm(self) -> None:
        if not self.armed:
            self.sleep = self.kernel._execute_sleep
            self.kernel._execute_sleep = 0.0
        self.armed = True

    def disarm(self) -> None:
        """Back to ipykernel's tail (the next request is under way)."""
        if self.armed:
            self.armed = False
            if self.kernel._execute_sleep == 0.0:   # else someone set it meanwhile: theirs stands
                self.kernel._execute_sleep = self.sleep


def skip_for_this_request(shell: Any, streams: Optional[list[Any]] = None) -> bool:
    """Send what the cell printed, then let the kernel reply to the running request without its
    flushes and sleep. False (nothing changed) outside an ipykernel kernel whose internals we know.
    ``streams``: the kernel's stdout and stderr (``sys``'s)."""
    kernel = getattr(shell, "kernel", None)
    streams = [sys.stdout, sys.stderr] if streams is None else streams
    if kernel is None or not hasattr(kernel, "_execute_sleep") or not all(map(is_kernel_stream, streams)):
        return False
    flush_streams(streams)   # first, so that on first use it counts flushes and waits for one in progress
    _tail_of(shell, kernel, streams).arm()
    return True


def _tail_of(shell: Any, kernel: Any, streams: list[Any]) -> _Tail:
    """``kernel``'s tail state (made on first use, with the event that disarms it); ``streams``' ``flush`` knows it."""
    found = getattr(kernel, "_mlxj_tail", None)
    tail = found if isinstance(found, _Tail) else _Tail(kernel)
    if tail is not found:
        kernel._mlxj_tail = tail
        shell.events.register("pre_execute", tail.disarm)
    for stream in streams:
        if getattr(stream.flush, "_mlxj_tail", None) is not tail:
            track_flushes(stream)
            stream.flush = _quick_flush(stream, tail)
    return tail


def _quick_flush(stream: Any, tail: _Tail) -> Any:
    """``stream.flush``, returning at once while the tail is skipped and nothing is buffered or being sent."""
    full = stream.flush

    def flush() -> None:
        if tail.armed and not has_output(stream):
            return
        full()

    flush._mlxj_tail = tail  # type: ignore[attr-defined]
    return flush
