"""How a rank runs a cell of the direct channel: as ipykernel's ``do_execute`` would, without its
per-cell overhead, and with top-level ``await`` working in an engine's kernel.

``do_execute`` transforms each cell twice, inspects ``run_cell``'s signature and asks whether the
cell is asynchronous, every time: a fifth of a rank's share of a trivial cell. A cell without the
words ``await`` or ``async`` cannot be asynchronous, so it goes straight to the shell's ``run_cell``
(what ``do_execute`` ends up calling for it). For the others, ``do_execute``'s asynchronous path
needs ipykernel's shell-channel thread, which an ipyparallel engine does not have; here the shell's
``run_cell_async`` runs as a task that SIGINT (the stop button, a peer's abort) cancels.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from typing import Any, Optional

#: without one of these words a cell has no top-level ``await`` (nor ``async for``/``async with``)
ASYNC_WORDS = ("await", "async")


def may_await(code: str) -> bool:
    """Whether ``code`` may be a cell with top-level ``await`` (else the shell's ``run_cell`` runs it)."""
    return any(word in code for word in ASYNC_WORDS)


async def run_cell(kernel: Any, code: str, silent: bool = False, store_history: bool = True,
                   user_expressions: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Run ``code`` in ``kernel``'s shell as ``do_execute`` would (history, display hooks, events, input
    refused); its reply content, as an ``execute_reply``'s."""
    shell = kernel.shell
    store_history = store_history and not silent
    kernel._forward_input(False)   # input() and getpass() say that the notebook cannot answer
    try:
        interrupted = False
        if not may_await(code):
            res = shell.run_cell(code, store_history=store_history, silent=silent)
        else:
            res, interrupted = await _run_maybe_async(shell, code, silent, store_history)
    finally:
        kernel._restore_input()
    return reply_content(shell, res, interrupted, user_expressions)


def install(kernel: Any) -> None:
    """Give an engine's kernel, which has no shell-channel thread, a way to run cells with top-level
    ``await`` that come through the controller (``do_execute``'s own needs that thread: it raised,
    and the request was never answered). Other cells keep ``do_execute``'s way."""
    if getattr(kernel, "shell_channel_thread", None) is not None:
        return
    original = kernel.do_execute

    async def do_execute(code: str, silent: bool, store_history: bool = True,
                         user_expressions: Optional[dict[str, Any]] = None, allow_stdin: bool = False,
                         **kwargs: Any) -> Any:
        if may_await(code):
            reply = await run_cell(kernel, code, silent, store_history, user_expressions)
            if reply["status"] == "error" and hasattr(kernel, "get_engine_info"):   # as ipyparallel's adds it
                reply["engine_info"] = kernel.get_engine_info(method="execute")
            return reply
        return await original(code, silent, store_history, user_expressions, allow_stdin, **kwargs)

    kernel.do_execute = do_execute


async def _run_maybe_async(shell: Any, code: str, silent: bool, store_history: bool) -> tuple[Any, bool]:
    """The shell's result for a cell that may await (and whether SIGINT cancelled it)."""
    try:
        transformed, before = shell.transform_cell(code), None
    except Exception:
        transformed, before = code, sys.exc_info()
    if not shell.should_run_async(code, transformed_cell=transformed, preprocessing_exc_tuple=before):
        return shell.run_cell(code, store_history=store_history, silent=silent), False
    task = asyncio.ensure_future(shell.run_cell_async(
        code, store_history=store_history, silent=silent, transformed_cell=transformed,
        preprocessing_exc_tuple=before))
    res = None
    cancelled = _cancel_on_sigint(task)
    try:
        res = await task
    finally:
        cancelled.restore()
        shell.events.trigger("post_execute")
        if not silent:
            shell.events.trigger("post_run_cell", res)
    return res, cancelled.fired


class _cancel_on_sigint:
    """While a cell's task runs: SIGINT cancels it (raising KeyboardInterrupt inside the event loop's
    own code would stop the loop instead of the cell). Main thread only; elsewhere it does nothing."""

    def __init__(self, task: "asyncio.Future[Any]"):
        self.fired = False
        self.saved: Any = None
        if threading.current_thread() is threading.main_thread():
            loop = asyncio.get_running_loop()

            def on_sigint(signum: int, frame: Any) -> None:
                self.fired = True
                loop.call_soon_threadsafe(task.cancel)

            self.saved = signal.signal(signal.SIGINT, on_sigint)

    def restore(self) -> None:
        if self.saved is not None:
            signal.signal(signal.SIGINT, self.saved)
            self.saved = None


def reply_content(shell: Any, res: Any, interrupted: bool = False,
                  user_expressions: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """An ``execute_reply``'s content for the shell's result ``res``, as ``do_execute`` makes it."""
    err: Optional[BaseException] = res.error_before_exec if res.error_before_exec is not None else res.error_in_exec
    reply: dict[str, Any]
    if res.success and not getattr(shell, "_last_traceback_during_displayhook", False):
        reply = {"status": "ok"}
    elif interrupted and isinstance(err, asyncio.CancelledError):
        reply = {"status": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": shell._last_traceback or []}
    else:
        reply = {"status": "error", "ename": type(err).__name__, "evalue": str(err),
                 "traceback": shell._last_traceback or []}
    reply["execution_count"] = shell.execution_count - 1
    ok = reply["status"] == "ok" and user_expressions
    reply["user_expressions"] = shell.user_expressions(user_expressions) if ok else {}
    payloads = getattr(shell, "payload_manager", None)
    if payloads is not None:   # e.g. %load's: read and cleared, as do_execute does (the notebook ignores them)
        reply["payload"] = payloads.read_payload()
        payloads.clear_payload()
    return reply
