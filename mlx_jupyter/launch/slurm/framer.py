"""The rank-side framer: runs a rank's command and passes its output on as framed lines (stdlib only).

slurmstepd forwards a task's output a line at a time, so a reply streamed token by token
(``print(tok, end="", flush=True)``) would show only at its newline. The framer reads the command's
stdout and stderr as it comes and writes each piece as one line of its own, ``FRAME`` + the piece
escaped (``\\`` ``\\n`` ``\\r``), at most ``PIECE`` bytes of output a line and never cutting a UTF-8
character; :mod:`.output` turns them back into pieces on the launcher's side. The task wrapper runs
this file's text with the rank's Python (``python -c SOURCE command...``), so it imports nothing of
ours. It ignores the signals the wrapper ignores (Slurm's reach the command in the same process group),
keeps reading until both pipes close, and exits with the command's code (128 + N for signal N).
"""

import os
import selectors
import signal
import subprocess
import sys
from typing import Callable, Dict, List

FRAME = b"\x1fmlxj:"
#: the most output bytes one framed line carries (escaped, at most twice that: slurmstepd's 1024-byte messages)
PIECE = 480
IGNORED = ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1")


def escape(data: bytes) -> bytes:
    """``data`` on one line: backslash, newline and carriage return escaped."""
    return data.replace(b"\\", b"\\\\").replace(b"\n", b"\\n").replace(b"\r", b"\\r")


def utf8_cut(data: bytes) -> int:
    """Where ``data`` can be cut: its length, less a UTF-8 character its end leaves unfinished."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:   # a character's first byte (or ASCII)
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4 if byte >> 3 == 0b11110 else 1
            return len(data) - back if need > back else len(data)
    return len(data)


def frames(data: bytes) -> List[bytes]:
    """``data`` (whole characters) as framed lines of at most :data:`PIECE` bytes of it each."""
    out = []
    while data:
        cut = len(data) if len(data) <= PIECE else (utf8_cut(data[:PIECE]) or PIECE)
        out.append(FRAME + escape(data[:cut]) + b"\n")
        data = data[cut:]
    return out


class Stream:
    """One of the command's pipes, relayed through ``out`` in frames; an unfinished character waits for the next read."""

    def __init__(self, out: Callable[[bytes], object]) -> None:
        self.out, self.held, self.open = out, b"", True

    def take(self, data: bytes) -> None:
        data = self.held + data
        cut = utf8_cut(data) if data else 0
        self.held = data[cut:]
        self.write(data[:cut])

    def end(self) -> None:
        self.write(self.held)
        self.held = b""

    def write(self, data: bytes) -> None:
        for line in frames(data):
            if self.open:
                try:
                    self.out(line)
                except OSError:   # srun is gone: drain the pipe anyway, so the command never blocks on it
                    self.open = False


def main(argv: List[str]) -> int:
    before = {name: signal.getsignal(getattr(signal, name)) for name in IGNORED if hasattr(signal, name)}
    for name in before:
        signal.signal(getattr(signal, name), signal.SIG_IGN)

    def as_before() -> None:   # the command gets the dispositions the framer was started with
        for name, handler in before.items():
            signal.signal(getattr(signal, name), signal.SIG_IGN if handler == signal.SIG_IGN else signal.SIG_DFL)

    try:
        # close_fds=False: the command gets the descriptors the wrapper opened for it (/proc/self/fd/N files)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=as_before,
                                close_fds=False)
    except OSError as exc:
        os.write(2, f"mlx-jupyter: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        return 127 if isinstance(exc, FileNotFoundError) else 126
    assert proc.stdout is not None and proc.stderr is not None
    streams: Dict[int, Stream] = {proc.stdout.fileno(): Stream(lambda b: os.write(1, b)),
                                  proc.stderr.fileno(): Stream(lambda b: os.write(2, b))}
    sel = selectors.DefaultSelector()
    for fd in streams:
        sel.register(fd, selectors.EVENT_READ)
    while sel.get_map():
        for key, _ in sel.select():
            data = os.read(key.fd, 65536)
            if data:
                streams[key.fd].take(data)
            else:
                sel.unregister(key.fd)
                streams[key.fd].end()
    code = proc.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
