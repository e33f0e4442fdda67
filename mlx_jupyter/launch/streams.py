"""Bytes from a rank's pipe in, text lines out (a partial line is flushed after a short silence)."""

from __future__ import annotations

import asyncio
import codecs
from typing import Callable, Optional


class LineSplitter:
    """Feed bytes; ``emit(line)`` gets each line without its newline.

    A trailing partial line (a ``pdb`` prompt, a progress bar) is emitted once
    no more bytes arrive for ``linger`` seconds, so prompts show up.
    """

    def __init__(self, emit: Callable[[str], None], linger: float = 0.1):
        self._emit = emit
        self._linger = linger
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self._timer: Optional[asyncio.TimerHandle] = None

    def feed(self, data: bytes) -> None:
        """Take a chunk; emit every complete line in it."""
        self._cancel()
        text = self._partial + self._decoder.decode(data)
        *lines, self._partial = text.split("\n")
        for line in lines:
            self._emit(line.removesuffix("\r"))
        if self._partial:
            self._timer = asyncio.get_running_loop().call_later(self._linger, self._flush)

    def close(self) -> None:
        """End of stream: emit whatever is left."""
        self._cancel()
        self._partial += self._decoder.decode(b"", final=True)
        self._flush()

    def _flush(self) -> None:
        self._timer = None
        if self._partial:
            text, self._partial = self._partial, ""
            self._emit(text)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def pump(reader: "asyncio.StreamReader", splitter: LineSplitter, chunk: int = 1 << 16) -> None:
    """Read ``reader`` until EOF into ``splitter`` (works for asyncio and asyncssh readers)."""
    try:
        while True:
            data = await reader.read(chunk)
            if not data:
                break
            splitter.feed(data if isinstance(data, bytes) else data.encode())
    except Exception:  # noqa: BLE001 - a broken stream (e.g. ssh connection lost) just ends it;
        pass           # the rank's fate is reported by its wait()
    finally:
        splitter.close()
