"""The one seam for a process's identity: Python and the shell watchdogs compute the same token."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from mlx_jupyter import proc_identity
from mlx_jupyter.proc_identity import SHELL_START_TOKEN, same_process, start_token


def _shell_token(pid: int, use_proc: bool) -> str:
    script = SHELL_START_TOKEN if use_proc else SHELL_START_TOKEN.replace("[ -r /proc/self/stat ]", "false")
    out = subprocess.run(["/bin/sh", "-c", script + '\nstart_token "$1"', "sh", str(pid)], capture_output=True,
                         text=True, env={"PATH": "/usr/bin:/bin", "TZ": "Asia/Tokyo", "LC_ALL": "de_DE.UTF-8"})
    return out.stdout.strip()


def test_a_live_process_has_one_token_here_and_in_the_shell_and_a_gone_one_none():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        token = start_token(child.pid)
        assert token and same_process(child.pid, token) and not same_process(child.pid, "1")
        assert not same_process(child.pid, None)
        if os.path.exists("/proc/self/stat"):
            assert _shell_token(child.pid, use_proc=True) == token
    finally:
        child.stdin.close()
        child.wait()
    assert start_token(child.pid) is None and not same_process(child.pid, token)


@pytest.mark.skipif(shutil.which("ps") is None, reason="no ps here")
def test_the_ps_branch_gives_the_shell_and_python_the_same_token_whatever_their_locale_and_zone(monkeypatch):
    monkeypatch.setenv("TZ", "America/New_York")
    token = proc_identity._ps_start(os.getpid())
    assert token and _shell_token(os.getpid(), use_proc=False) == token
    assert proc_identity._ps_start(2 ** 22 + 12345) is None


def test_a_zombie_is_not_running_though_its_pid_and_start_remain():
    """An orphan's init may be slow to reap it (seen here: a SIGKILLed kernel's controller stayed a zombie), and
    the registry took such a controller for alive, keeping its key files."""
    import os
    import subprocess
    import sys

    from mlx_jupyter.proc_identity import running, start_token

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    token = start_token(child.pid)
    assert token is not None and running(child.pid)
    child.stdin.close()   # it ends; waitid with WNOWAIT waits for that without reaping it: a zombie now
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
    assert not running(child.pid)
    assert start_token(child.pid) == token   # the zombie's pid and start are still there
    child.wait(10)
    assert not running(child.pid) and not running(0) and not running(-1)
