"""Waiting for a connection file that another process writes."""

from __future__ import annotations

import json
import time


def await_json_file(path: str, timeout: float, poll: float = 0.005) -> bool:
    """Until ``path`` holds valid JSON (True) or ``timeout`` s passed (False)."""
    end = time.monotonic() + timeout
    while True:
        try:
            with open(path) as fh:
                json.load(fh)
            return True
        except (OSError, ValueError):
            if time.monotonic() > end:
                return False
        time.sleep(poll)
