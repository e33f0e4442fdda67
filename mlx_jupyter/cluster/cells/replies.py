"""A rank's reply to a cell as the run reads it: an ipyparallel future's outcome as reply content,
and whether an error says the rank was stopped from outside rather than failing by itself."""

from __future__ import annotations

from typing import Any

#: errors a rank shows when it was stopped from outside: we interrupted it, a peer
#: aborted our core's group, or MLX's sockets were closed under a blocked collective
RELEASE_ERRORS = {"AbortedError", "PeerError"}
RELEASE_TEXT = ("connection to a peer was lost",)


def is_release_error(ename: str, evalue: str, stopped: bool) -> bool:
    """Whether a rank's error says it was stopped from outside rather than failing by itself.

    ``stopped``: we sent this rank an abort, or a peer died, during this run.
    Our core's abort errors always count; an interrupt or MLX's lost connection
    only when we caused it (a `world` closed in an earlier cell is an error).
    """
    if ename in RELEASE_ERRORS:
        return True
    return stopped and (ename == "KeyboardInterrupt" or any(t in evalue for t in RELEASE_TEXT))


def reply_content(fut: Any) -> dict[str, Any]:
    """An ipyparallel execute future's outcome as reply content (status, ename, evalue, traceback)."""
    exc = fut.exception()
    result = exc if exc is not None else fut.result()
    if type(result).__name__ == "ExecuteReply":
        return {"status": "ok"}
    if type(result).__name__ == "TaskAborted":
        return {"status": "aborted"}
    ename = getattr(result, "ename", None) or type(result).__name__
    evalue = getattr(result, "evalue", None)
    evalue = str(result) if evalue is None else str(evalue)
    tb = getattr(result, "traceback", None) or []
    if isinstance(tb, str):
        tb = tb.split("\n")
    return {"status": "error", "ename": ename, "evalue": evalue, "traceback": list(tb)}
