"""The panel's hostfile field: a file under the server's root directory, read off the event loop.

The path is confined to the root the server serves (as the contents API is: no ``..`` out of it,
no symlink out of it, no hidden file unless the contents manager allows them). The file is read
as every entry point reads a hostfile (:mod:`mlx_jupyter.safe_read`: a regular file of at most
``MAX_BYTES``, opened non-blocking), in a thread of its own within ``READ_TIMEOUT``: a FIFO, a
device or a hung network mount must not freeze the server. Errors name the file and the field,
never what the file holds. The checked text is copied to a private file, so that what the
cluster reads later is what was checked.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from mlx_jupyter.hostfile import Hostfile, HostfileError, decode_json, parse_hostfile
from mlx_jupyter.safe_read import MAX_BYTES, READ_TIMEOUT, FileRefused, read_now
from mlx_jupyter.server.requests import RequestError

__all__ = ["MAX_BYTES", "READ_TIMEOUT", "READERS", "CheckedHostfile", "HostfileReader"]

#: reads that outlived their timeout and still hold their thread (stuck in the kernel: a hung
#: mount) before new reads are refused; reads that are merely running at once are not limited
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
        self._hung = 0                      # reads given up on whose thread has not returned yet
        self._copies: Optional[str] = None   # a private dir (0700), made at the first copy
        self._closed = False

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
        if self._hung >= READERS:
            raise RequestError(FIELD, f"{name!r}: {self._hung} earlier hostfile reads are still hanging (a hung "
                                      "network mount?); try again later, with a regular local file")
        fut = _in_thread(self._read, name, path)
        try:
            text = await asyncio.wait_for(asyncio.shield(fut), self.timeout)
        except asyncio.TimeoutError:
            self._hung += 1   # counted until its thread really returns
            fut.add_done_callback(self._unhung)
            raise RequestError(FIELD, f"{name!r} could not be read within {self.timeout:g} s (a device or a "
                                      "hung network mount?); give a regular local file") from None
        return CheckedHostfile(name, _parse(name, text), self._copy(name, text))

    def _unhung(self, fut: "asyncio.Future[str]") -> None:
        self._hung -= 1
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
        try:
            return read_now(real, repr(name))
        except FileRefused as exc:
            raise RequestError(FIELD, str(exc)) from None

    def _copy(self, name: str, text: str) -> str:
        if self._closed:   # the server is shutting down: nothing may be left behind
            raise RequestError(FIELD, "the server is shutting down")
        if self._copies is None:
            self._copies = tempfile.mkdtemp(prefix="mlx-jupyter-server-")
            # also at the interpreter's exit: jupyter_server (2.x) never calls a module extension's
            # unload hook, so a server stopped while a cluster starts would leave the copy behind
            self._finalizer = weakref.finalize(self, shutil.rmtree, self._copies, True)
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
        self._closed = True
        if self._copies is not None:
            self._finalizer()


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
        data = decode_json(text, repr(name))   # its messages quote nothing of the text
    except HostfileError as exc:
        raise RequestError(FIELD, str(exc)) from None
    try:
        return parse_hostfile(data, f"hostfile {name!r}")
    except HostfileError as exc:
        where = f"host entry {exc.entry} (rank {exc.entry})" if exc.entry is not None else "its top level"
        raise RequestError(FIELD, f"{name!r} is not a valid hostfile: {where} is wrong (see docs/hostfiles.md "
                                  "for the format; `mlx-jupyter config` writes one)") from None
