"""Read a small regular file without hanging: the one way every entry point reads a hostfile.

Opened non-blocking (a FIFO must not wait for a writer), refused unless it is a regular file,
capped at ``MAX_BYTES``, and, through :func:`read_text`, read in a thread of its own within a
timeout (a hung network mount must not freeze the caller). Errors name the file, never its content.
"""

from __future__ import annotations

import os
import stat
import threading

#: the largest hostfile read (a hostfile of 64 hosts with RDMA matrices is a few KiB)
MAX_BYTES = 1 << 20
#: seconds a read may take (a local file takes milliseconds)
READ_TIMEOUT = 5.0


class FileRefused(ValueError):
    """The file cannot be read as a small text file; the message names it (``label``) and why."""


def read_now(path: str, label: str, max_bytes: int = MAX_BYTES) -> str:
    """The text of the regular file ``path`` (at most ``max_bytes``), read in the calling thread.

    ``label`` names the file in messages (e.g. ``"hostfile 'h.json'"``).
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise FileRefused(f"{label}: cannot open it ({exc.strerror or type(exc).__name__})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(f"{label} is not a regular file (a FIFO, a device or a directory?); give a JSON file")
        too_big = FileRefused(f"{label} is larger than {max_bytes // 1024} KiB: not a hostfile")
        if st.st_size > max_bytes:
            raise too_big
        chunks, size = [], 0
        while size <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise FileRefused(f"{label}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    finally:
        os.close(fd)
    if size > max_bytes:   # it grew after the fstat
        raise too_big
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise FileRefused(f"{label} is not UTF-8 text: not a hostfile") from None


def read_text(path: str, label: str, timeout: float = READ_TIMEOUT, max_bytes: int = MAX_BYTES) -> str:
    """:func:`read_now` in a daemon thread, given up on after ``timeout`` seconds (the thread of a
    read stuck in the kernel is left behind; being a daemon, it never holds up the exit)."""
    result: list[str] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(read_now(path, label, max_bytes))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            error.append(exc)

    reader = threading.Thread(target=run, name="mlx-small-file-read", daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        raise FileRefused(f"{label} could not be read within {timeout:g} s (a hung network mount?); "
                          "give a regular local file")
    if error:
        raise error[0]
    return result[0]

