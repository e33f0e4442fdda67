"""Where a launch's rank output goes: the caller's callbacks, else this process's terminal."""

from __future__ import annotations

import asyncio
import sys
from typing import Callable, Optional

from mlx_jupyter.launch.launch_config import LaunchConfig
from mlx_jupyter.vocab.rankinfo import rank_prefix
from mlx_jupyter.launch.terminal import TERMINAL


class RankOutput:
    """``(rank, stream, text, ends)`` in, from the streams' splitters (:class:`~.streams.LineSplitter`).

    ``config.on_text`` gets each piece as it comes, ``ends`` telling whether it ends its line.
    ``config.on_output`` gets one call per line as ever: an unfinished line's pieces are joined, and given
    as they are only once no more comes for :data:`STALL` s (a prompt shows; the rest of the line comes in
    the call its newline ends). With neither, the text goes to this process's terminal, prefixed with
    ``[rank r]`` when ``size()`` is above 1.
    """

    def __init__(self, config: LaunchConfig, size: Callable[[], int]):
        self.config, self.size = config, size
        self._lines = LineHold(self._line)   # on_output's whole lines (a stalled one as it is)

    def __call__(self, rank: int, stream: str, text: str, ends: bool = True) -> None:
        c = self.config
        if c.on_text is None and c.on_output is None:
            size = self.size()
            TERMINAL.write(rank, stream, text, ends, rank_prefix(rank, size) if size > 1 else "", breaks=size > 1)
            return
        if c.on_text is not None:
            self._call(c.on_text, rank, stream, text, ends)
        if c.on_output is not None:
            self._lines(rank, stream, text, ends)

    def _line(self, rank: int, stream: str, text: str, ends: bool) -> None:
        """``on_output``'s call: a whole line, or what a stalled line holds so far."""
        if self.config.on_output is not None:
            self._call(self.config.on_output, rank, stream, text)

    @staticmethod
    def _call(callback: Callable[..., None], *args: object) -> None:
        try:   # a user callback must not kill the launcher
            callback(*args)
        except Exception as exc:  # noqa: BLE001
            print(f"mlx-jupyter launch: output callback failed: {exc!r}", file=sys.stderr)


#: seconds an unfinished line stays unchanged before ``on_output`` gets it as it is (a prompt)
STALL = 0.1


class LineHold:
    """Pieces of an unfinished line, held up to :data:`STALL` s and passed to ``emit`` joined: a line that
    comes in chunks (mpirun forwards its ranks' output so) is written whole, not broken where another
    rank's output comes between; one still unfinished after that goes on as it is (a prompt, a streamed
    reply), at most :data:`STALL` s behind."""

    def __init__(self, emit: Callable[[int, str, str, bool], None]) -> None:
        self.emit = emit
        self._held: dict[tuple[int, str], str] = {}
        self._timers: dict[tuple[int, str], asyncio.TimerHandle] = {}

    def __call__(self, rank: int, stream: str, text: str, ends: bool) -> None:
        key = (rank, stream)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        text = self._held.pop(key, "") + text
        loop = _running_loop()
        if ends or loop is None:
            self.emit(rank, stream, text, ends)
            return
        self._held[key] = text
        self._timers[key] = loop.call_later(STALL, self._stalled, key)

    def _stalled(self, key: tuple[int, str]) -> None:
        self._timers.pop(key, None)
        text = self._held.pop(key, "")
        if text:
            self.emit(key[0], key[1], text, False)

    def flush(self) -> None:
        """Pass on what is held now (the launch ends)."""
        for key in list(self._held):
            self._stalled(key)
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


def _running_loop() -> Optional[asyncio.AbstractEventLoop]:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
