"""The panel's hostfile field: a file under the server's root directory, read off the event loop.

The path is confined to the root the server serves (as the contents API is: no ``..`` out of it,
no symlink out of it, no hidden file unless the contents manager allows them). The file must be
a regular file of at most ``MAX_BYTES``, read in a thread of its own within ``READ_TIMEOUT``: a
FIFO, a device or a hung network mount must not freeze the server. Errors name the file and the
field, never what the file holds. The checked text is copied to a private file, so that what the
cluster reads later is what was checked.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from mlx_jupyter.hostfile import Hostfile, HostfileError, parse_hostfile
from mlx_jupyter.server.requests import RequestError

#: the largest hostfile read (a hostfile of 64 hosts with RDMA matrices is a few KiB)
MAX_BYTES = 1 << 20
#: seconds a read may take (a local file takes milliseconds)
READ_TIMEOUT = 5.0
#: reads at a time; a read stuck in the kernel (a hung mount) keeps its thread until it returns
READERS = 2
FIELD = "hostfile"


@dataclass
class CheckedHostfile:
    """A hostfile read and parsed: ``name`` as the request gave it, ``copy`` the private file to use."""

    name: str
    hostfile: Hostfile
    copy: str


class HostfileReader:
    """Reads the hostfiles requests name, confined to ``root_dir``; ``close()`` removes the copies."""

    def __init__(self, root_dir: str, allow_hidden: bool = False, timeout: float = READ_TIMEOUT):
        self.root = os.path.realpath(os.path.expanduser(root_dir))
        self.allow_hidden = allow_hidden
        self.timeout = timeout
        self._busy = 0
        self._copies: Optional[str] = None   # a private dir (0700), made at the first copy

    @property
    def root_path(self) -> "Path":
        """The root, as a Path."""
        return Path(self.root)

    def locate(self, name: str) -> str:
        """The file ``name`` means (relative to the root, or absolute inside it), or a RequestError."""
        if "\0" in name:
            raise RequestError(FIELD, "a path cannot contain a NUL byte")
        path = os.path.expanduser(name)
        path = os.path.normpath(path if os.path.isabs(path) else os.path.join(self.root, path))
        if not _inside(path, self.root):
            raise RequestError(FIELD, f"{name!r} is outside the directory this Jupyter server serves; "
                                      "give a path under it, as in the file browser")
        return path

    async def read(self, name: str) -> CheckedHostfile:
        """Check, read and parse the hostfile ``name``; RequestError (naming it) when it is not one."""
        path = self.locate(name)
        if self._busy >= READERS:
            raise RequestError(FIELD, f"{name!r}: earlier hostfile reads are still hanging (a FIFO or a hung "
                                      "network mount?); try again later, with a regular local file")
        self._busy += 1
        fut = _in_thread(self._read, name, path)
        fut.add_done_callback(self._done)   # the thread is counted until it really returns
        try:
            text = await asyncio.wait_for(asyncio.shield(fut), self.timeout)
        except asyncio.TimeoutError:
            raise RequestError(FIELD, f"{name!r} could not be read within {self.timeout:g} s (a FIFO, a device "
                                      "or a hung network mount?); give a regular local file") from None
        return CheckedHostfile(name, _parse(name, text), self._copy(name, text))

    def _done(self, fut: "asyncio.Future[str]") -> None:
        self._busy -= 1
        if not fut.cancelled():
            fut.exception()   # retrieved: a read that ended after its request gave up is not an error

    def _read(self, name: str, path: str) -> str:
        """In a reader thread: the file's text, if it is a regular file under the root, not hidden, small."""
        real = os.path.realpath(path)
        if not _inside(real, self.root):
            raise RequestError(FIELD, f"{name!r} leads outside the directory this Jupyter server serves "
                                      "(a symlink?); give a file under it")
        if not self.allow_hidden and _hidden(real, self.root):
            raise RequestError(FIELD, f"{name!r} is hidden (or in a hidden directory); the server does not "
                                      "serve hidden files")
        try:   # O_NONBLOCK: opening a FIFO must not wait for a writer
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise RequestError(FIELD, f"{name!r}: cannot open it ({exc.strerror or type(exc).__name__})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RequestError(FIELD, f"{name!r} is not a regular file")
            if st.st_size > MAX_BYTES:
                raise RequestError(FIELD, f"{name!r} is larger than {MAX_BYTES // 1024} KiB: not a hostfile")
            chunks, size = [], 0
            while size <= MAX_BYTES and (chunk := os.read(fd, MAX_BYTES + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
        except OSError as exc:
            raise RequestError(FIELD, f"{name!r}: cannot read it ({exc.strerror or type(exc).__name__})") from None
        finally:
            os.close(fd)
        data = b"".join(chunks)
        if len(data) > MAX_BYTES:
            raise RequestError(FIELD, f"{name!r} is larger than {MAX_BYTES // 1024} KiB: not a hostfile")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise RequestError(FIELD, f"{name!r} is not UTF-8 text: not a hostfile") from None

    def _copy(self, name: str, text: str) -> str:
        if self._copies is None:
            self._copies = tempfile.mkdtemp(prefix="mlx-jupyter-server-")
        fd, path = tempfile.mkstemp(dir=self._copies, suffix="-" + os.path.basename(name)[-64:])
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return path

    @staticmethod
    def forget(copy: Optional[str]) -> None:
        """Remove a copy once its cluster is gone."""
        if copy:
            try:
                os.unlink(copy)
            except OSError:
                pass

    def close(self) -> None:
        """Remove every copy (a read still hanging keeps its daemon thread, which never blocks exit)."""
        if self._copies is not None:
            shutil.rmtree(self._copies, ignore_errors=True)


def _in_thread(fn: Callable[..., Any], *args: Any) -> "asyncio.Future[Any]":
    """``fn(*args)`` in a daemon thread of its own: a call stuck in the kernel must not hold up the
    server's exit (an executor's threads are joined at exit)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not fut.done():
            fut.set_result(value) if ok else fut.set_exception(value)

    def run() -> None:
        try:
            result: tuple[bool, Any] = (True, fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            result = (False, exc)
        try:
            loop.call_soon_threadsafe(settle, *result)
        except RuntimeError:   # the loop is closed: nobody waits any more
            pass

    threading.Thread(target=run, name="mlx-hostfile-read", daemon=True).start()
    return fut


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _hidden(path: str, root: str) -> bool:
    from jupyter_core.paths import is_hidden

    return is_hidden(path, root)


def _parse(name: str, text: str) -> Hostfile:
    """The parsed hostfile; a refusal says where it is wrong without quoting it."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(FIELD, f"{name!r} is not valid JSON (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise RequestError(FIELD, f"{name!r} is not a hostfile (nested too deeply)") from None
    try:
        return parse_hostfile(data, f"hostfile {name!r}")
    except HostfileError as exc:
        where = f"host entry {exc.entry} (rank {exc.entry})" if exc.entry is not None else "its top level"
        raise RequestError(FIELD, f"{name!r} is not a valid hostfile: {where} is wrong (see docs/hostfiles.md "
                                  "for the format; `mlx-jupyter config` writes one)") from None
