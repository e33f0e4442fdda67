"""Reading a cell's live tables of where the ranks are, as a kernel's client sees them."""

from __future__ import annotations

import queue
import re
import time
from typing import Callable, Optional

from tests.cluster.kernel import Kernel


def tables_until(k: Kernel, msg_id: str, pattern: re.Pattern, timeout: float,
                 on_match: Optional[Callable[[], object]] = None) -> tuple[float, str, list]:
    """Seconds from the cell's start to the first live table matching ``pattern`` (``on_match()`` is then
    called once), and every table seen until the cell ended."""
    started = found = None
    text, seen = "", []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = k.kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "status" and content["execution_state"] == "busy":
            started = time.monotonic()
        elif kind in ("display_data", "update_display_data"):
            plain = content.get("data", {}).get("text/plain", "")
            seen.append(plain)
            if found is None and pattern.search(plain):
                found, text = time.monotonic() - started, plain
                if on_match is not None:
                    on_match()
        elif kind == "status" and content["execution_state"] == "idle":
            break
    assert found is not None, f"no live table matched {pattern.pattern}; saw {seen[-3:]}"
    return found, text, seen


def displays_until_idle(k: Kernel, msg_id: str, timeout: float) -> list[str]:
    """Every display text (live tables, lines) the cell showed until it ended, or ``timeout`` s passed."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = k.kc.get_iopub_msg(timeout=0.5)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] in ("display_data", "update_display_data"):
            seen.append(msg["content"].get("data", {}).get("text/plain", ""))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    return seen
