"""Helpers for launcher tests: run the CLI, wait for output lines, read CPU time."""

from __future__ import annotations

import codecs
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import psutil

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
#: the first line of each table ``--where-on-signal`` prints
WHERE_HEADER = "where the ranks are"
#: the least time between two asks of ``LiveCLI.where_showing``, and how long it gives a table's last line
WHERE_ASK_GAP, WHERE_TAIL = 0.3, 0.1


def table_rows(table: str) -> int:
    """How many rank rows (``N  state ...``) the text after a where table's title holds so far."""
    return sum(1 for line in table.split("\n")[2:] if re.match(r"\d+ ", line))


def cli_env(extra: Optional[dict] = None) -> dict:
    """Environment for a CLI subprocess that imports this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    env.update(extra or {})
    return env


def collector() -> tuple[list, Callable]:
    """A thread-safe list of (rank, stream, line) and the on_output callback that fills it."""
    out: list = []
    lock = threading.Lock()

    def on_output(rank, stream, line):
        with lock:
            out.append((rank, stream, line))
    return out, on_output


def cli(args: Sequence[str], timeout: float = 60, stdin: Optional[str] = None, **kw) -> subprocess.CompletedProcess:
    """Run ``mlx-jupyter launch ARGS`` to completion."""
    return subprocess.run([PY, "-m", "mlx_jupyter", "launch", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, env=cli_env(kw.pop("env", None)), cwd=kw.pop("cwd", ROOT), **kw)


class LiveCLI:
    """A running ``mlx-jupyter launch ARGS`` (or any ``argv``); lines of its stdout/stderr are collected as they come."""

    def __init__(self, args: Sequence[str], env: Optional[dict] = None, argv: Optional[Sequence[str]] = None,
                 stdin: bool = False):
        cmd = list(argv) if argv is not None else [PY, "-m", "mlx_jupyter", "launch", *args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(env), cwd=ROOT)
        self.lines: list[str] = []
        self.streams: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._partial = {"stdout": "", "stderr": ""}   # each stream's unfinished line (a prompt), seen as it comes
        self._cond = threading.Condition()
        self._threads = [threading.Thread(target=self._read, args=(s, name), daemon=True)
                         for s, name in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr"))]
        for t in self._threads:
            t.start()

    def _read(self, stream, name: str) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while True:
            data = os.read(stream.fileno(), 1 << 16)
            with self._cond:
                *done, self._partial[name] = (self._partial[name] + decoder.decode(data, final=not data)).split("\n")
                if not data and self._partial[name]:
                    done.append(self._partial[name])
                    self._partial[name] = ""
                self.lines.extend(done)
                self.streams[name].extend(done)
                self._cond.notify_all()
            if not data:
                return

    def _so_far(self, stream: str) -> list[str]:
        """``stream``'s lines and its unfinished one (under the lock)."""
        return self.streams[stream] + ([self._partial[stream]] if self._partial[stream] else [])

    def write(self, text: str, close: bool = False) -> None:
        """Send ``text`` to the launcher's stdin (opened with ``stdin=True``); ``close`` ends it."""
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()
        if close:
            self.proc.stdin.close()

    def wait_until(self, done: Callable[[str], bool], stream: str = "stderr", timeout: float = 30) -> str:
        """Block until ``done(text of stream so far)``; return that text; raise on timeout."""
        with self._cond:
            ok = self._cond.wait_for(lambda: done("\n".join(self._so_far(stream))), timeout)
            text = "\n".join(self._so_far(stream))
        if not ok:
            raise TimeoutError(f"waited {timeout} s on {stream}; got:\n" + self.text)
        return text

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 30) -> list[str]:
        """Block until ``count`` lines match ``pattern`` (regex); raise on timeout."""
        rx = re.compile(pattern)
        with self._cond:
            def seen() -> list[str]:
                return [x for x in self.lines + [p for p in self._partial.values() if p] if rx.search(x)]
            ok = self._cond.wait_for(lambda: len(seen()) >= count, timeout)
            if not ok:
                raise TimeoutError(f"waited {timeout} s for {count} x {pattern!r}; got:\n" + "\n".join(self.lines))
            return seen()

    def finish(self, timeout: float = 30) -> int:
        """Wait for exit (kill on timeout) and for the output readers."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise
        finally:
            for t in self._threads:
                t.join(5)

    def where_showing(self, want: Sequence[str], ranks: int, timeout: float = 15, per_ask: float = 4.0) -> str:
        """SIGUSR1 to the launcher (``--where-on-signal``) until one table on stderr matches every regex in
        ``want``; that table. A rank that has printed "ready" may still be a line short of where it will wait
        when the first signal lands, so it asks again once the last table is complete (a row for each of the
        ``ranks``, then its optional diagnosis line) and does not match; ``per_ask``: how long a table may take."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            seen = self.wait_until(lambda t: True).count(WHERE_HEADER)

            def shown(text: str) -> bool:
                last = text.rsplit(WHERE_HEADER, 1)[-1]
                return text.count(WHERE_HEADER) > seen and all(re.search(p, last, re.M) for p in want)

            def rows_in(text: str) -> bool:
                return text.count(WHERE_HEADER) > seen and table_rows(text.rsplit(WHERE_HEADER, 1)[-1]) >= ranks

            asked = time.monotonic()
            self.proc.send_signal(signal.SIGUSR1)
            try:
                text = self.wait_until(lambda t: shown(t) or rows_in(t), timeout=min(per_ask, left))
            except TimeoutError:
                continue
            if not shown(text):
                # the rows are in; the diagnosis line, if any, comes in the same print: give it WHERE_TAIL s,
                # and space the asks WHERE_ASK_GAP s apart (each has every rank sample its stack; Slurm: scancel)
                wait = min(max(WHERE_TAIL, asked + WHERE_ASK_GAP - time.monotonic()), deadline - time.monotonic())
                try:
                    text = self.wait_until(shown, timeout=max(wait, 0))
                except TimeoutError:
                    continue
            return text.rsplit(WHERE_HEADER, 1)[1]
        raise AssertionError(f"no table showed {list(want)} within {timeout} s:\n{self.text}")

    def __enter__(self) -> "LiveCLI":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    @property
    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines)


def cpu_seconds(pid: int) -> float:
    """User+system CPU time of a process (all its threads)."""
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def pid_alive(pid: int) -> bool:
    """Whether a pid exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_pids_gone(pids: Sequence[int], timeout: float) -> list[int]:
    """Wait (bounded) for the pids to end; return those still alive."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=max(timeout, 0))
    return [p.pid for p in alive if pid_alive(p.pid)]


def watchers_of(pid: int) -> set[psutil.Process]:
    """The local watchdog processes started by launcher ``pid``."""
    found = set()
    for p in psutil.Process(pid).children():
        try:
            if "mlx-jupyter-watchdog" in p.cmdline():
                found.add(p)
        except psutil.Error:   # a child that just ended
            pass
    return found


def watcher_of(pid: int) -> psutil.Process:
    """The one local watchdog of launcher ``pid``."""
    watchers = watchers_of(pid)
    assert len(watchers) == 1, f"launcher {pid} has {len(watchers)} watchdogs"
    return watchers.pop()
