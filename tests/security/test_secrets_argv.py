"""No secret in any process's command line (issue 21, item 1): the job token, ``--env`` values and
ipyparallel's connection key reach the ranks through the environment, ssh stdin or private files,
never through argv, which every user of a host can read (``ps``, ``/proc/PID/cmdline``)."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
import sys
import threading

import pytest

from argv_scan import ArgvScan
from needs import require_core
from mlx_jupyter.hostfile import Host
from mlx_jupyter.launch import Launcher

pytestmark = pytest.mark.timeout(120)
PY = sys.executable
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: each rank reports digests of what it received (never the values), then waits to be stopped
RANK_CODE = ("import hashlib, os, time; h = lambda k: hashlib.sha256(os.environ.get(k, '').encode()).hexdigest(); "
             "print('ready', h('MLX_JUPYTER_TOKEN'), h('SECRET_X'), flush=True); time.sleep(60)")


def digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class Ready:
    """on_output that collects the ranks' "ready" lines; ``wait(n)`` until n have come."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []
        self.other: list[str] = []
        self._cond = threading.Condition()

    def __call__(self, rank: int, stream: str, line: str) -> None:
        with self._cond:
            (self.lines.append((rank, line)) if line.startswith("ready ") else self.other.append(line))
            self._cond.notify_all()

    def wait(self, n: int, timeout: float) -> list[str]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.lines) >= n, timeout), \
                f"{len(self.lines)} of {n} ranks ready within {timeout} s; output: {self.other[-20:]}"
            return [line for _, line in self.lines]


def test_the_scan_finds_a_secret_in_a_command_line():
    """The scan itself can fail: a process with a secret in its argv is found (and named)."""
    canary = "canary-" + secrets.token_hex(8)
    proc = subprocess.Popen(["sh", "-c", "echo up; read x", "sh", canary], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"up\n"   # it runs (exec'd): its argv is the canary's
        scan = ArgvScan({"CANARY": canary})
        scan.scan()
        assert any(f"CANARY in pid {proc.pid}" in f for f in scan.found), scan.found
    finally:
        proc.communicate(b"\n", timeout=10)


def test_no_secret_in_argv_during_an_ssh_launch(testbed):
    """Two namespace hosts over ssh (real sshd): the rank wrappers live as long as the ranks."""
    value = "sk-live-" + secrets.token_hex(12)
    ready = Ready()
    hosts = [Host(ip, [ip]) for ip in testbed.ips[:2]]
    launcher = Launcher([PY, "-c", RANK_CODE], hosts=hosts, ssh_options=testbed.ssh_options(),
                        env={"SECRET_X": value}, on_output=ready)
    with ArgvScan({"SECRET_X": value}) as scan:
        launcher.start()
        try:
            scan.secrets = {"SECRET_X": value, "MLX_JUPYTER_TOKEN": launcher.token}
            lines = ready.wait(2, 60)
            scan.scan()   # every wrapper, watchdog and rank is up now
        finally:
            launcher.stop()
    assert lines == [f"ready {digest(launcher.token)} {digest(value)}"] * 2   # the values did arrive
    assert scan.scans > 1 and not scan.found, "\n".join(scan.found)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed (apt-get install openmpi-bin)")
def test_no_secret_in_argv_during_a_local_mpi_launch():
    value = "hf_" + secrets.token_hex(12)
    ready = Ready()
    root_ok = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}  # the tests run as root
    launcher = Launcher([PY, "-c", RANK_CODE], hosts="127.0.0.1", repeat_hosts=2, backend="mpi",
                        env={"SECRET_X": value, **root_ok}, on_output=ready)
    with ArgvScan({"SECRET_X": value}) as scan:
        launcher.start()
        try:
            scan.secrets = {"SECRET_X": value, "MLX_JUPYTER_TOKEN": launcher.token}
            lines = ready.wait(2, 60)
            scan.scan()   # mpirun and both ranks are up now
        finally:
            launcher.stop()
    assert lines == [f"ready {digest(launcher.token)} {digest(value)}"] * 2
    assert scan.scans > 1 and not scan.found, "\n".join(scan.found)


def test_no_secret_in_argv_during_a_remote_cluster_start(testbed):
    """A Cluster over ssh: its engines get ipyparallel's connection info (with the HMAC key) in
    their environment; neither that key, the job token nor an env value shows in any argv."""
    require_core()
    from mlx_jupyter.cluster import Cluster

    value = "secret-" + secrets.token_hex(12)
    c = Cluster(n=1, hosts=testbed.ips[:2], ssh_options=testbed.ssh_options(), controller_ip=f"{testbed.net}.1",
                env={"SECRET_X": value}, timeout=60)
    with ArgvScan({"SECRET_X": value}) as scan:
        try:
            c.start()
            key = c.client.session.key.decode()
            token = c.ipp.engines[next(iter(c.ipp.engines))].launcher.token
            scan.secrets = {"SECRET_X": value, "IPP key": key, "MLX_JUPYTER_TOKEN": token}
            scan.scan()   # controller, every engine and its wrapper are up now
            view = c.client[:]
            view.execute("import os; _secret_x = os.environ.get('SECRET_X')", block=True)
            got = view.pull("_secret_x", block=True)
        finally:
            c.stop()
    assert key and got == [value, value]
    assert scan.scans > 1 and not scan.found, "\n".join(scan.found)
