"""Bytes from a rank's pipe in, text lines out (an unfinished line in pieces, as it comes);
the noise a failing rank prints while it ends, held and said in one line."""

from __future__ import annotations

import asyncio
import codecs
import re
import sys
from typing import Callable, Optional, Protocol

#: what MLX's ring prints (once per retry) when its sockets are gone, e.g. after a peer was stopped
RING_NOISE = re.compile(r"^\[ring\] (Socket \d+ was closed by the peer|(Sending to|Receiving from) socket \d+ "
                        r"failed with errno \d+|Too many send/recv errors\. Failing pending tasks\.\.\.)$")
#: what is left of ring errors that MLX's threads wrote at once, interleaved within one line
#: ("[ring][ring]  SocketSocket  34  was closed by the peerwas closed by the peer"): their words only
RING_WORDS = re.compile(r"\[ring\]|[Ss]ocket|was closed by the peer|Sending to|Receiving from|failed with errno"
                        r"|Too many send/recv errors\.|Failing pending tasks\.\.\.|\d+|\s+")
#: CPython's dump of an exception it could not print at exit (its sys.stderr was gone)
EXIT_DUMP = re.compile(r"^(object (address|refcount|type|type name|repr) *:.*|lost sys\.std(err|out))$")


class EndingNoise:
    """A rank's ending noise on stderr (MLX's ring socket errors, CPython's exit dump): :meth:`hold`
    keeps it back, :meth:`line` says it in one line when the rank has ended."""

    def __init__(self) -> None:
        self.ring: dict[int, tuple[str, int]] = {}   # rank -> (first ring error, how many)
        self.dumped: dict[int, str] = {}             # rank -> the repr of the exception CPython dumped

    def hold(self, rank: int, line: str) -> bool:
        """Whether ``line`` (of stderr) is noise, now held."""
        text = line.strip()
        if RING_NOISE.match(text):
            first, n = self.ring.get(rank, (text, 0))
            self.ring[rank] = (first, n + 1)
            return True
        if "[ring]" in text and not RING_WORDS.sub("", text):   # several threads' errors, interleaved
            first, n = self.ring.get(rank, ("[ring] socket errors on several threads at once", 0))
            self.ring[rank] = (first, n + text.count("[ring]"))
            return True
        if rank in self.ring and not RING_WORDS.sub("", text):   # a fragment an interleaved pair split off
            return True                                       # (or the newline it moved): "3 was closed by the peer"
        if EXIT_DUMP.match(text):
            if text.startswith("object repr"):
                self.dumped[rank] = text.split(":", 1)[1].strip()
            return True
        return False

    def line(self, rank: int) -> Optional[str]:
        """The one line for ``rank``'s held noise (None: none), then forgotten."""
        ring, dumped = self.ring.pop(rank, None), self.dumped.pop(rank, None)
        parts = [f"{dumped} at exit"] if dumped else []
        if ring:
            first, n = ring
            parts.append(f"{first}" + (f" (and {n - 1} more MLX ring socket errors like it)" if n > 1 else "")
                         if not parts else f"after {n} MLX ring socket errors ({first})")
        return "; ".join(parts) or None


#: ``emit(text, ends_line)``: a whole line (its newline taken off) with True, a piece of an unfinished line with False
Emit = Callable[[str, bool], None]


class LineSplitter:
    """Feed bytes; ``emit(text, ends_line)`` gets each line without its newline, in pieces as it comes.

    Text of an unfinished line (a reply streamed token by token, a ``pdb`` prompt, a progress bar) is
    emitted as a piece ``linger`` seconds after its first byte came, whether or not more follows; the
    rest of that line comes later, ending with the piece that has ``ends_line``. ``linger`` None: whole
    lines only (a line's pieces are joined here).
    """

    def __init__(self, emit: Emit, linger: Optional[float] = 0.05):
        self._emit = emit
        self._linger = linger
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""
        self._midline = False   # a piece of the current line was emitted: its end must be too
        self._timer: Optional[asyncio.TimerHandle] = None

    def feed(self, data: bytes) -> None:
        """Take a chunk; emit every complete line in it, and time the piece it leaves."""
        text = self._partial + self._decoder.decode(data)
        *lines, self._partial = text.split("\n")
        for line in lines:
            self._midline = False
            self._emit(line.removesuffix("\r"), True)
        if lines:
            self._cancel()
        if self._partial and self._linger is not None and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._linger, self._flush)

    def close(self) -> None:
        """End of stream: emit whatever is left, as the end of its line."""
        self._cancel()
        self._partial += self._decoder.decode(b"", final=True)
        if self._partial or self._midline:
            text, self._partial, self._midline = self._partial, "", False
            self._emit(text, True)

    def _flush(self) -> None:
        self._timer = None
        # a "\r" at the end is held back: it may be the first half of a "\r\n"
        text = self._partial.removesuffix("\r")
        if text:
            self._partial = self._partial[len(text):]
            self._midline = True
            self._emit(text, False)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class ByteReader(Protocol):
    """A pipe's reading end: asyncio's ``StreamReader``, or asyncssh's ``SSHReader`` of a session without encoding."""

    async def read(self, n: int = -1) -> bytes: ...


async def pump(reader: ByteReader, splitter: LineSplitter, chunk: int = 1 << 16) -> None:
    """Read ``reader`` until EOF into ``splitter``. A broken stream (an ssh connection lost) just ends it: the
    rank's fate is reported by its wait(). A fault of ours in showing a chunk is said once, and the rest goes on."""
    said = False
    try:
        while True:
            try:
                data = await reader.read(chunk)
            except Exception:  # noqa: BLE001 - see the docstring
                break
            if not data:
                break
            try:
                splitter.feed(data)
            except Exception as exc:  # noqa: BLE001 - never the rank's output lost in silence
                if not said:
                    print(f"mlx-jupyter launch: internal error showing a rank's output (a chunk of it is lost): "
                          f"{exc!r}", file=sys.stderr)
                    said = True
    finally:
        splitter.close()
