"""Helpers for the configurator's end-to-end tests: paths, running the CLI, bounded polling."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "thunderbolt"
PY = sys.executable


def mlx_jupyter(args: Sequence[str], timeout: float = 60, env: dict | None = None,
                no_fd0: bool = False) -> subprocess.CompletedProcess:
    """Run ``python -m mlx_jupyter ARGS`` from this checkout with stdin /dev/null (``no_fd0``: fd 0 closed)."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), full_env.get("PYTHONPATH", "")]))
    full_env.update(env or {})
    argv = [PY, "-m", "mlx_jupyter", *args]
    if no_fd0:
        argv = ["sh", "-c", 'exec "$@" 0<&-', "sh", *argv]
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                          env=full_env, cwd=ROOT)


def wait_until(pred, timeout: float) -> bool:
    """Poll ``pred`` (state in other processes) until true or ``timeout`` s; bounded."""
    deadline, tick = time.monotonic() + timeout, threading.Event()
    while not pred():
        if time.monotonic() > deadline:
            return False
        tick.wait(0.02)
    return True
