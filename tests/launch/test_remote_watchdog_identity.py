"""The remote watchdog (plain sh, run here as on a host) kills a registered rank's group only while
its pid still names the rank registered: a recycled pid is left alone (issue 44 §4)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from mlx_jupyter.launch.script import MARKER, watchdog_script
from mlx_jupyter.proc_identity import start_token

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("recorded", ["its own start", "another start", "no start"])
def test_the_remote_watchdog_kills_a_registered_pid_only_while_it_is_the_rank_registered(tmp_path, recorded):
    rank = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                            start_new_session=True)
    watchdog = subprocess.Popen(["/bin/sh", "-c", watchdog_script()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)})
    try:
        marker, folder = watchdog.stdout.readline().rstrip("\n").rsplit(" ", 1)
        assert marker == MARKER
        token = start_token(rank.pid)
        tokens = {"its own start": token, "another start": "1", "no start": ""}
        with open(f"{folder}/{rank.pid}", "w") as f:   # as the rank's wrapper writes it: its temp dir, its start
            f.write(f"{tmp_path}/mlx-jupyter.x\n{tokens[recorded]}\n")
        watchdog.stdin.close()   # the launcher's connection is gone: the watchdog cleans up
        assert watchdog.wait(10) == 0 and watchdog.stderr.read() == ""
        if recorded == "its own start":
            assert rank.wait(5) == -signal.SIGKILL
        else:
            assert rank.poll() is None, "the watchdog killed a process it did not start"
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()


def test_a_signal_line_for_a_registered_pid_that_names_another_process_now_is_not_delivered(tmp_path):
    """The launcher's ``SIGNAME -PGID`` lines: a group whose registration says another start is skipped."""
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                              start_new_session=True) for _ in range(2)]
    watchdog = subprocess.Popen(["/bin/sh", "-c", watchdog_script()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)})
    try:
        folder = watchdog.stdout.readline().rstrip("\n").rsplit(" ", 1)[1]
        stale, rank = procs
        with open(f"{folder}/{stale.pid}", "w") as f:
            f.write(f"{tmp_path}/mlx-jupyter.x\n1\n")   # registered for an earlier process of that pid
        with open(f"{folder}/{rank.pid}", "w") as f:
            f.write(f"{tmp_path}/mlx-jupyter.y\n{start_token(rank.pid)}\n")
        watchdog.stdin.write(f"TERM -{stale.pid} -{rank.pid}\n")
        watchdog.stdin.flush()
        assert rank.wait(10) == -signal.SIGTERM
        assert stale.poll() is None, "the signal reached a process the launcher did not start"
        watchdog.stdin.close()
        assert watchdog.wait(10) == 0 and stale.poll() is None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
