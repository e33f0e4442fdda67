"""The way out of a rank's stuck cell: a SIGINT for the cell it names, and MLX's sockets closed.

:meth:`CellInterrupt.send` interrupts the running cell (Python stops at its next bytecode; an op
of our core stops too). The SIGINT names its cell: one handled only after that cell ended is
dropped, never delivered to the next request (:meth:`CellInterrupt.on_sigint`). A cell still
frozen in native code ``grace`` seconds later (an MLX collective, which cannot be cancelled) has
MLX's world sockets closed (:meth:`CellInterrupt.release_native`).
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any, Callable, Optional, Protocol, Union

#: what ``signal.getsignal`` gives: a handler, SIG_DFL/SIG_IGN, or None (not set from Python)
Handler = Union[Callable[[int, Optional[FrameType]], Any], int, signal.Handlers, None]


class Request(Protocol):
    """The agent's current request, as an interrupt reads it (:class:`~.agent.RankAgent` is one)."""

    @property
    def executing(self) -> bool: ...
    @property
    def cell(self) -> int: ...  # the request's number
    @property
    def kind(self) -> str: ...  # "cell" or "apply"
    @property
    def returned(self) -> bool: ...  # an apply request's handler has returned (its reply is sent)
    @property
    def abort_reason(self) -> Optional[str]: ...
    @property
    def world_closed(self) -> str: ...  # why MLX's world sockets were closed ("": they were not)
    def close_world(self, reason: str) -> bool: ...


class CellInterrupt:
    """Interrupts ``request``'s cells; ``lock`` is the one under which the request begins and ends."""

    def __init__(self, request: Request, lock: threading.Lock, shell: Any, ending: frozenset[CodeType],
                 grace: float = 0.3):
        """``ending``: the code of the request's end, where an interrupt comes too late; ``grace``: the
        seconds a cell may stay frozen in native code before MLX's sockets are closed."""
        self.request, self.lock, self.shell, self.ending, self.grace = request, lock, shell, ending, grace
        self.target: Optional[int] = None  # the cell the last SIGINT we sent is for
        self.next_handler: Handler = signal.default_int_handler
        self.error_before: Any = None  # sys.last_value when the cell began: the shell sets it anew if it raises
        self.peer_stopped = 0  # the cell a peer's notice stopped (its interrupt names the peer)

    def begin(self) -> None:
        """A request begins: put :meth:`on_sigint` in front of its SIGINT handler (main thread only).

        ipykernel installs the handler per request (``default_int_handler``, or its
        coroutine canceller for async cells) and restores its own afterwards, so this
        wrapper lives exactly as long as the request of this cell.
        """
        self.error_before = getattr(sys, "last_value", None)
        if threading.current_thread() is not threading.main_thread():
            return
        current = signal.getsignal(signal.SIGINT)
        if getattr(current, "__self__", None) is self:
            return
        self.next_handler = current
        signal.signal(signal.SIGINT, self.on_sigint)

    def send(self, cell: int) -> None:
        """SIGINT to the main thread for ``cell``, which runs (called under ``lock``: it cannot end
        before the signal is sent; if the handler runs only after it ended, it is dropped)."""
        self.target = cell
        # to the main thread itself: a signal taken by another thread would not
        # wake a blocking call there (sleep, select) until it returns by itself
        signal.pthread_kill(_main_thread_id(), signal.SIGINT)

    def on_sigint(self, signum: int, frame: Optional[FrameType]) -> None:
        """SIGINT in the main thread: interrupt the cell it was meant for, swallow a stale one.

        :meth:`send` sends SIGINT only while the cell it names runs (checked under
        the lock the cell's end takes), but the handler runs later, at the main
        thread's next bytecode: by then that cell may be ending (in the agent's
        ``_post_run_cell``) or over. Such an interrupt is dropped, never passed
        to the next cell. A SIGINT not sent by the agent is handled as usual.
        """
        request = self.request
        target, self.target = self.target, None
        if target is not None:
            if not request.executing or target != request.cell:
                return  # meant for a cell that has ended
            if frame is not None and frame.f_code in self.ending:
                return  # its code is done; it is ending
            if request.kind == "apply" and request.returned:
                return  # the request's handler has returned (its reply is sent)
            if self._showing_traceback(frame) or self._raised_by_itself():
                return  # the cell already failed by itself (a peer's abort): it is ending
        nxt = self.next_handler
        if target is not None and target == self.peer_stopped and nxt is signal.default_int_handler:
            raise KeyboardInterrupt(f"stopped because {request.abort_reason}")  # which peer, and its error
        if callable(nxt) and nxt is not self.on_sigint:
            nxt(signum, frame)
        else:
            raise KeyboardInterrupt

    def _raised_by_itself(self) -> bool:
        """Whether the shell has shown this cell's own error (its code is done; the cell is ending).

        Its peers' release comes when one rank raises; a rank whose own error was shown at that
        moment would otherwise trade its traceback (what ``%mlx_debug`` opens) for a KeyboardInterrupt.
        An interrupt landing before the error is shown still turns it into "stopped because rank N
        raised ...", which names the cause when the peer's error is what broke this rank's op.
        """
        shown = getattr(sys, "last_value", None)   # set once the shell has shown the cell's error
        return shown is not None and shown is not self.error_before and not isinstance(shown, KeyboardInterrupt)

    def _showing_traceback(self, frame: Optional[FrameType], depth: int = 40) -> bool:
        """Whether ``frame`` is inside the shell's ``showtraceback``: the cell's code is done.

        An interrupt landing there is printed by IPython as a stray "KeyboardInterrupt".
        """
        code = getattr(getattr(type(self.shell), "showtraceback", None), "__code__", None)
        while frame is not None and depth > 0 and code is not None:
            if frame.f_code is code:
                return True
            frame, depth = frame.f_back, depth - 1
        return False

    def release_native(self, cell: int, reason: str, hold: Optional[Callable[[int], Optional[str]]] = None,
                       window: float = 1.5) -> None:
        """Close MLX's sockets if the cell's main thread stays frozen in native code.

        A thread running Python (say, formatting the KeyboardInterrupt) moves
        from instruction to instruction; one blocked in a C call (an MLX
        collective waiting for a peer) keeps the same frame and instruction.
        Close only after ``grace`` seconds without a move, and then, with ``hold``, only
        once it says no drain released the cell (its answer: why, added to ``reason``).
        """
        request, main = self.request, _main_thread_id()
        end = time.monotonic() + window
        last: Optional[tuple[int, int]] = None
        still_since = time.monotonic()
        while time.monotonic() < end:
            with self.lock:
                if not (request.executing and request.cell == cell):
                    return
            frame = sys._current_frames().get(main)
            where = (id(frame), frame.f_lasti if frame is not None else -1)
            del frame
            now = time.monotonic()
            if where != last:
                last, still_since = where, now
            elif now - still_since >= (self.grace if hold is None else min(self.grace, HOLD_AFTER)):
                why = hold(cell) if hold is not None else ""
                if why is None:
                    return  # drained: the cell ends by itself, MLX's world is kept
                if why:
                    reason = f"{reason}; not drained: {why}"
                with self.lock:  # still that cell: never close the sockets under the next one
                    if request.executing and request.cell == cell and not request.world_closed:
                        request.close_world(reason)
                return
            time.sleep(0.01)


#: with a drain to wait for, a cell this long frozen is held (nothing is closed at that point)
HOLD_AFTER = 0.15


def _main_thread_id() -> int:
    """The main thread's id (set since it started)."""
    return threading.main_thread().ident or 0
