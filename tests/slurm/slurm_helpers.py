"""Helpers of the Slurm tests (a module of its own: ``conftest`` is a name every test dir has)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rank_temp_files(folder: Path = Path("/tmp")) -> set[Path]:
    """What task wrappers leave in ``folder`` (their TMPDIR; the nodes share this machine's /tmp)."""
    return set(folder.glob("mlx-jupyter.*"))


def wait_until(pred, timeout: float) -> bool:
    """Probe ``pred`` until true or timeout (for state outside this process: Slurm's queue)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not pred():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.1)
    return True
