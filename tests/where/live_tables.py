"""Reading a cell's live tables of where the ranks are, as a kernel's client sees them."""

from __future__ import annotations

import queue
import re
import time
from typing import Callable, Iterator, Optional

from tests.cluster.kernel import Kernel


def _cell_messages(k: Kernel, msg_id: str, timeout: float) -> Iterator[tuple[str, dict]]:
    """(type, content) of each IOPub message of the cell ``msg_id``, up to its idle status (included),
    or until ``timeout`` s passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = k.kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        yield msg["msg_type"], msg["content"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return


def tables_until(k: Kernel, msg_id: str, pattern: re.Pattern, timeout: float,
                 on_match: Optional[Callable[[], object]] = None) -> tuple[float, str, list]:
    """Seconds from the cell's start to the first live table matching ``pattern`` (``on_match()`` is then
    called once), and every table seen until the cell ended."""
    started = found = None
    text, seen = "", []
    for kind, content in _cell_messages(k, msg_id, timeout):
        if kind == "status" and content["execution_state"] == "busy":
            started = time.monotonic()
        elif kind in ("display_data", "update_display_data"):
            plain = content.get("data", {}).get("text/plain", "")
            seen.append(plain)
            if found is None and pattern.search(plain):
                found, text = time.monotonic() - started, plain
                if on_match is not None:
                    on_match()
    assert found is not None, f"no live table matched {pattern.pattern}; saw {seen[-3:]}"
    return found, text, seen


def displays_until_idle(k: Kernel, msg_id: str, timeout: float) -> list[str]:
    """Every display text (live tables, lines) the cell showed until it ended, or ``timeout`` s passed."""
    return [content.get("data", {}).get("text/plain", "") for kind, content in _cell_messages(k, msg_id, timeout)
            if kind in ("display_data", "update_display_data")]
