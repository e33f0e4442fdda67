"""Every process's command line, searched for secrets: what any user of the host can read.

``/proc/PID/cmdline`` is world-readable (``ps`` shows it), unlike ``/proc/PID/environ``. The
namespace hosts of the test bed share this machine's pid namespace, so one scan covers them too.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Mapping


def command_lines() -> dict[int, bytes]:
    """pid -> its raw command line, for every process that is still there while we read."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    out[int(entry)] = fh.read()
            except OSError:  # it ended meanwhile
                pass
    return out


@dataclass
class ArgvScan:
    """Scans every command line for ``secrets`` (name -> value): now (``scan``) and, in a thread
    while it is started, again and again, so that short-lived processes are seen too."""

    secrets: Mapping[str, str]
    found: list[str] = field(default_factory=list)   # "NAME in pid P: <command line>"
    scans: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def scan(self) -> None:
        """One pass over every process."""
        needles = {name: value.encode() for name, value in self.secrets.items() if value}
        hits = []
        for pid, cmd in command_lines().items():
            for name, value in needles.items():
                if value in cmd:
                    shown = cmd.replace(b"\0", b" ")[:300]
                    hits.append(f"{name} in pid {pid}: {shown!r}")
        with self._lock:
            self.found.extend(h for h in hits if h not in self.found)
            self.scans += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scan()
            self._stop.wait(0.02)   # the scan is the measurement, not a synchronisation

    def __enter__(self) -> "ArgvScan":
        self._thread = threading.Thread(target=self._loop, name="argv-scan", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
