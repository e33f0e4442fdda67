"""The launcher's terminal: ranks' text written as it comes, a line continued while the same rank and
stream write it, the ``[rank r]`` prefix only at line starts (and again after a ``\\r``), a line break
only where other output comes between."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Optional, TextIO

#: (rank, stream) whose line is open
Key = tuple[int, str]


@dataclass
class _Screen:
    """One place output goes (stdout and stderr share one when they are the same file or terminal)."""

    open: Optional[Key] = None   # whose line is unfinished here
    target: Optional[TextIO] = None   # the stream it was written to
    fresh: bool = False          # the cursor is back at the line's start (after a "\r"): prefix before more text


class Terminal:
    """Writes rank text to ``sys.stdout``/``sys.stderr`` (looked up at each write), keeping lines whole."""

    def __init__(self) -> None:
        self._screens: dict[str, _Screen] = {}
        self._shared = _Screen()
        self._cut: set[Key] = set()   # whose unfinished line was ended here for other output
        self._held: dict[Key, str] = {}   # unlabelled ranks' unfinished lines, written whole (see write)

    def write(self, rank: int, stream: str, text: str, ends: bool, prefix: str = "", breaks: bool = True,
              whole: bool = False) -> None:
        """``text`` of ``rank``'s ``stream``; ``ends``: it ends the line. ``breaks``: end another's open line first
        (False for unlabelled output, written as the ranks wrote it). ``whole`` (unlabelled output of several
        ranks): a line is written once it ends, so that no two ranks' pieces mix within a line."""
        target = sys.stdout if stream == "stdout" else sys.stderr
        if not breaks and whole and rank >= 0:
            key = (rank, stream)
            if not ends:
                self._held[key] = self._held.get(key, "") + text
                return
            text = self._held.pop(key, "") + text
        if not breaks:   # as the ranks wrote it: nothing added, nothing tracked
            _put(target, text + ("\n" if ends else ""))
            return
        screen = self._screen(stream)
        key = (rank, stream)
        if screen.open is not None and screen.open != key:
            self._end(screen)
        if key in self._cut and screen.open != key:
            self._cut.discard(key)
            if ends and not text:   # the newline of a line already ended here
                return
        continuing = screen.open == key
        at_start = not continuing or screen.fresh
        parts: list[str] = []
        for i, piece in enumerate(text.split("\r")):
            if i:
                parts.append("\r")
                at_start = True
            if piece:
                if at_start:
                    parts.append(prefix)
                parts.append(piece)
                at_start = False
        if ends:
            if not continuing and not text:
                parts.append(prefix)   # an empty line is still a labelled line
            parts.append("\n")
            screen.open, screen.target, screen.fresh = None, None, False
        else:
            screen.open, screen.target, screen.fresh = key, target, at_start
        _put(target, "".join(parts))

    def end_lines(self) -> None:
        """End every open line (before a message of the launcher's own, and when the launch ends)."""
        held, self._held = self._held, {}
        for (_, stream), text in held.items():   # a line the rank left unfinished, ended as the launch ends
            _put(sys.stdout if stream == "stdout" else sys.stderr, text + "\n")
        for screen in {id(s): s for s in [self._shared, *self._screens.values()]}.values():
            if screen.open is not None:
                self._end(screen)

    def say(self, message: str, file: Optional[TextIO] = None) -> None:
        """A line of the launcher's own (on stderr unless ``file``), on a line of its own."""
        target = file or sys.stderr
        screen = self._screen("stdout" if target is sys.stdout else "stderr")
        if screen.open is not None:
            self._end(screen)
        _put(target, message + "\n")

    def _screen(self, stream: str) -> _Screen:
        if _same_file(sys.stdout, sys.stderr):
            return self._shared
        return self._screens.setdefault(stream, _Screen())

    def _end(self, screen: _Screen) -> None:
        if screen.target is not None:
            _put(screen.target, "\n")
        if screen.open is not None:
            self._cut.add(screen.open)
        screen.open, screen.target, screen.fresh = None, None, False


def _same_file(a: TextIO, b: TextIO) -> bool:
    """Whether two streams write to one file or terminal (then their lines share one screen)."""
    try:
        sa, sb = os.fstat(a.fileno()), os.fstat(b.fileno())
    except (AttributeError, ValueError, OSError):   # no file behind them (captured): treat them as one
        return True
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _put(target: TextIO, text: str) -> None:
    try:
        target.write(text)
        target.flush()
    except (BrokenPipeError, ValueError):   # a closed pipe (| head): nothing more to show
        pass


#: the one terminal of this process: every launch and the launcher's own messages share it
TERMINAL = Terminal()
