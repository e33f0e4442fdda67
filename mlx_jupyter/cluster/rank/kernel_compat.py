"""Every use of the engine kernel's private API (ipykernel, ipyparallel's engine kernel), in one place.

Checked when a rank's agent is installed (:func:`check_kernel`); a kernel that lacks one
of these fails the cluster's start with a message naming the fix, rather than running
without it. Pinned in pyproject.toml to the versions tested. ipykernel's ``OutStream``
internals (:func:`flush_streams`) are used only where present; elsewhere the streams are
flushed the public way.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

#: how to get a kernel whose internals this package uses (named in every compat error)
KERNEL_FIX = "install ipykernel 7.x and ipyparallel 9.x: pip install 'ipykernel>=7,<8' 'ipyparallel>=9,<10'"

#: what the agent and the cell channel use: the shell and its session, the request handler
#: tables (abort and status requests, tracked apply requests), ipyparallel's set of aborted
#: requests and its "aborted" reply, ipykernel's lock that runs one shell request at a
#: time (without it a direct-channel cell could overtake a %px request), and its input
#: forwarding, switched around a channel cell as do_execute does (:mod:`.cell_runner`)
KERNEL_NEEDS = ("shell", "session", "control_handlers", "shell_handlers", "aborted", "_send_abort_reply",
                "_main_asyncio_lock", "_forward_input", "_restore_input")


def _versions() -> str:
    found = []
    for name in ("ipykernel", "ipyparallel"):
        try:
            module = __import__(name)
            found.append(f"{name} {getattr(module, '__version__', '?')}")
        except ImportError:
            found.append(f"no {name}")
    return ", ".join(found)


def kernel_problems(kernel: Any) -> list[str]:
    """The kernel internals this package needs that ``kernel`` lacks (``[]``: none)."""
    return [name for name in KERNEL_NEEDS if not hasattr(kernel, name)]


def check_kernel(kernel: Any) -> None:
    """Raise RuntimeError naming what is missing if the agent cannot work with ``kernel``."""
    missing = kernel_problems(kernel)
    if missing:
        raise RuntimeError(f"the engine's kernel has no {', '.join(missing)} ({_versions()}); {KERNEL_FIX}")


def main_lock(kernel: Any) -> Any:
    """ipykernel's lock around each shell request: a cell holding it runs alone."""
    return kernel._main_asyncio_lock


def send_abort_reply(kernel: Any, stream: Any, parent: dict[str, Any], ident: Any) -> Any:
    """Answer ``parent`` "aborted", as the kernel does for a request aborted while queued."""
    return kernel._send_abort_reply(stream, parent, ident)


def _track_flushes(stream: Any) -> bool:
    """Count ``stream``'s ``_flush`` calls in progress (``_mlxj_flushing``); False if it was not yet counted.

    ``_flush`` clears the stream's pending flag before it sends what it took from the buffer,
    so only this count tells that a flush is still sending.
    """
    if hasattr(stream, "_mlxj_flushing"):
        return True
    original = stream._flush

    def _flush() -> None:
        stream._mlxj_flushing += 1
        try:
            original()
        finally:
            stream._mlxj_flushing -= 1

    stream._mlxj_flushing = 0
    stream._flush = _flush
    return False


def _has_output(stream: Any) -> bool:
    """Whether ``stream`` holds text not yet sent, or is sending some now (read in that order)."""
    return bool(stream._flush_pending or stream._buffers or stream._mlxj_flushing)


def flush_streams(streams: list[Any], timeout: float = 10.0) -> None:
    """Have every output of the cell's stdout and stderr sent before this returns.

    ipykernel's ``OutStream`` sends from its IOPub thread. When nothing is buffered or being
    sent (the usual cell), this returns at once; else one marker scheduled on that thread
    after a ``_flush`` of each stream with text is one round trip for both, instead of
    ``flush()``'s one each. Streams that are not ipykernel's are flushed as usual.
    """
    streams = [s for s in streams if s is not None]
    pub = getattr(streams[0], "pub_thread", None) if streams else None
    thread = getattr(pub, "thread", None)
    if (pub is None or thread is None or not thread.is_alive() or thread.ident == threading.get_ident()
            or not all(getattr(s, "pub_thread", None) is pub and hasattr(s, "_flush")
                       and hasattr(s, "_flush_pending") and hasattr(s, "_buffers") for s in streams)):
        for s in streams:
            s.flush()
        return
    counted = all([_track_flushes(s) for s in streams])  # a list: every stream gets counted, not only the first
    busy = [s for s in streams if _has_output(s)]
    if counted and not busy:
        return
    for s in busy:
        pub.schedule(s._flush)
    done = threading.Event()
    pub.schedule(done.set)
    if not done.wait(timeout):
        print("mlx_jupyter: flushing the cell's output timed out", file=sys.__stderr__)
