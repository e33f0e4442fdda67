"""mlx_jupyter.Cluster over ssh: one rank per host of the namespace test bed (4 hosts, real sshd).

The controller runs here and listens on the bed's bridge address (the hosts' way back to
this machine); the engines start on the hosts through our launcher. Needs root (else skipped).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from needs import require_core
from mlx_jupyter.cluster import Cluster
from mlx_jupyter.cluster.cells.display import show_run

pytestmark = pytest.mark.timeout(90)

CELL = """\
import os, socket, numpy as np, mlx_jupyter.distributed as d
where = (int(os.environ["MLX_RANK"]), socket.gethostname(), world.rank(), world.size())
mlx_sum = mx.distributed.all_sum(mx.array([world.rank() + 1.0])).item()
core_sum = float(d.all_sum(np.array([group.rank() + 1.0]))[0])
mpl = os.environ.get("MPLBACKEND")
"""


def _wait_until(pred, timeout: float) -> bool:
    """Poll state outside this process (the hosts' process tables) until true or timeout."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while not pred():
        if time.monotonic() > deadline:
            return False
        tick.wait(0.05)
    return True


def _non_sshd(bed) -> dict[int, list[int]]:
    """Per host, every process but its sshd (the listener and sessions still closing)."""
    sshd = bed.procs_matching("sshd")
    out = {i: [p for p in bed.ns_pids(i) if p not in sshd.get(i, [])] for i in range(1, bed.n + 1)}
    return {i: pids for i, pids in out.items() if pids}


def _temp_dirs_of(pids: set[int]) -> set[Path]:
    """The hosts' temp dirs of the ranks with these pids (the hosts share this machine's /tmp, as do other
    users' launches): each host's watchdog dir holds a file named by each rank it guards, which names that
    rank's own temp dir."""
    ours = set()
    for d in Path("/tmp").glob("mlx-jupyter.*"):
        for f in (d.iterdir() if d.is_dir() else []):
            if f.name.isdigit() and int(f.name) in pids:
                ours.add(d)
                try:
                    ours.add(Path(f.read_text().strip()))
                except OSError:
                    pass
    return ours


def _outgoing_from(bed, host: int, port: int, to: str) -> subprocess.Popen:
    """An outgoing connection on ``host`` whose local port is ``port`` (any outgoing connection may take a
    port of Linux's range 32768-60999), held until killed."""
    code = ("import socket, sys; s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); "
            "s.connect((sys.argv[3], 22)); print('held', flush=True); sys.stdin.read()")
    p = subprocess.Popen(["ip", "netns", "exec", bed.ns(host), sys.executable, "-c", code, bed.ips[host - 1],
                          str(port), to], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_cluster_on_four_ssh_hosts(testbed, caplog, descendants):
    require_core()
    bed = testbed
    n = len(bed.ips)
    # where our core listened up to now by default (MLX's 32323 + 1000 for rank 1): an outgoing connection
    # there made rank 1 fail to listen and the others time out (a fresh-clone CI run); it listens below now
    held = _outgoing_from(bed, 2, 33324, bed.ips[0])
    before = descendants()
    assert bed.procs_matching("mlx_jupyter.cluster.rank.engine") == {}
    t0 = time.monotonic()
    c = Cluster(n=1, hosts=bed.ips, ssh_options=bed.ssh_options(), controller_ip=f"{bed.net}.1", timeout=30)
    try:
        c.start()
        assert c.client.ids == list(range(n))
        on_hosts = bed.procs_matching("mlx_jupyter.cluster.rank.engine")
        assert sorted(on_hosts) == list(range(1, n + 1)), on_hosts  # one engine on each host
        ours = _temp_dirs_of({p for pids in on_hosts.values() for p in pids})
        assert len(ours) >= n, ours   # a watchdog dir per host, and each rank's own
        info = c.setup(timeout=20)
        assert not any(i["group_error"] for i in info.values()), \
            "\n".join(f"rank {r}: {i['group_error']}" for r, i in info.items())  # whole: the first error is the cause
        # ssh'd ranks dial back to the notebook's cell channel; start waits for that only 2 s (then
        # cells take the controller's path), which a loaded CI machine can exceed: wait here instead
        missing = c.cell_server.wait_connected(c.ranks, 15)
        assert not missing, f"ranks {missing} never dialled back to the cell channel: {caplog.text}"
        ran = show_run(c.run(CELL), timeout=20)
        assert ran.via == "channel", "the remote ranks are not on the direct cell channel"  # ssh'd ranks dial back
        for rank in range(n):  # addressed by engine id: the engine with id r is MLX rank r, on host r+1
            [where] = c.pull("where", targets=[rank])
            assert tuple(where) == (rank, f"h{rank + 1}", rank, n)
        total = n * (n + 1) / 2
        assert c.pull("mlx_sum") == [total] * n
        assert c.pull("core_sum") == [total] * n
        # remote ranks get the same plots as local ones, not whatever the notebook's kernel had
        assert c.pull("mpl") == ["module://matplotlib_inline.backend_inline"] * n
    finally:
        c.stop()
        held.kill()
        held.wait(5)
    assert _wait_until(lambda: bed.procs_matching("mlx_jupyter.cluster.rank.engine") == {}, 5), \
        f"engines left on the hosts: {bed.procs_matching('mlx_jupyter.cluster.rank.engine')}"
    assert _wait_until(lambda: not _non_sshd(bed), 5), f"processes left on the hosts: {_non_sshd(bed)}"
    assert _wait_until(lambda: not any(d.exists() for d in ours), 5), [d for d in ours if d.exists()]
    left = [p for p in descendants() - before if psutil.pid_exists(p)]
    assert not left, f"local processes left behind: {left}"
    assert time.monotonic() - t0 < 60


def test_a_failed_keep_state_restart_on_ssh_hosts_leaves_no_files(testbed):
    """The ranks on two ssh hosts save their names, then the new ranks cannot start: nothing is left
    in the hosts' shared memory (removed over ssh, no rank of ours being left there), and the error
    says what was lost and what to do next."""
    from mlx_jupyter.cluster import ClusterError
    from mlx_jupyter.cluster.rank import keep_files

    bed = testbed
    c = Cluster(n=1, hosts=bed.ips[:2], ssh_options=bed.ssh_options(), controller_ip=f"{bed.net}.1", timeout=30)
    try:
        c.start()

        def ours() -> set[str]:   # the bed's hosts share this machine's /dev/shm, as do other users' restarts
            return {n for n in keep_files.folders_here() if n.endswith(f"-{c.cluster_id}")}

        before = ours()
        show_run(c.run("import numpy as np\nv = np.arange(4) + world.rank()"), timeout=20)
        launcher = c.processes.ipp.config.MLXEngineSetLauncher
        good, launcher.python = launcher.python, "/nonexistent/python3"
        saw: list[set] = []
        real_restart = c.processes.restart

        def restart_seen(*args, **kwargs):   # the old ranks' files exist when the new ranks start
            saw.append(ours() - before)
            return real_restart(*args, **kwargs)

        c.processes.restart = restart_seen
        with pytest.raises(ClusterError) as failed:
            c.restart(timeout=30)
        msg = str(failed.value)
        assert len(saw) == 1 and len(saw[0]) == 1, saw   # there was a folder to remove
        assert msg.startswith("starting the new ranks failed (") and "lost: the 2 names saved on 2 ranks" \
            in msg and "the saved files were removed" in msg and "Next: fix the cause, then cluster.restart()" in msg, msg
        assert ours() == before
        launcher.python = good
        c.restart(timeout=30, quiet=True)
        show_run(c.run("s = mx.distributed.all_sum(mx.ones(1)).item()"), timeout=20)
        assert c.pull("s") == [2.0, 2.0]
    finally:
        c.stop()
