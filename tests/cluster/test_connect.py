"""``Cluster.connect`` / ``%mlx_cluster connect``: a notebook using a cluster another process owns
(the lab panel's server, another kernel): cells and data work, the processes stay the owner's."""

from __future__ import annotations

import os
import signal
import time

import pytest

from mlx_jupyter.cluster import Cluster, ClusterError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def owner(tmp_path_factory):
    """A running 2-rank cluster, published in a runtime dir of this module's own (the panel's listing)."""
    runtime = tmp_path_factory.mktemp("jupyter-runtime")
    old = os.environ.get("JUPYTER_RUNTIME_DIR")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(runtime)
    c = Cluster(n=2, timeout=60).start()
    yield c
    c.stop()
    if old is None:
        os.environ.pop("JUPYTER_RUNTIME_DIR", None)
    else:
        os.environ["JUPYTER_RUNTIME_DIR"] = old


def test_connected_handle_runs_cells_and_moves_data(owner):
    c = Cluster.connect(owner.cluster_id, timeout=30)
    try:
        assert c.size == 2 and c.owner["id"] == owner.cluster_id and c.cell_server is None
        c.setup()
        r = c.run("x = mx.distributed.all_sum(mx.array([world.rank() + 1.0]), group=world).item()")
        assert r.wait(30) and not r.failed
        assert c.pull("x") == [3.0, 3.0]
        c.push({"y": 5})
        assert c.pull("y") == [5, 5]
        rows = c.status()
        assert [row["rank"] for row in rows] == [0, 1]
        assert [row["pid"] for row in rows] == [i.pid for i in owner.engine_set.launcher.ranks]
        assert all(row["state"] in ("idle", "busy") for row in rows)
    finally:
        c.stop()
    # disconnecting leaves the owner's ranks running
    assert owner.running and owner.pull("y") == [5, 5]


def test_connect_without_id_takes_the_only_cluster(owner):
    c = Cluster.connect(timeout=30)
    try:
        assert c.cluster_id == owner.cluster_id
    finally:
        c.stop()


def test_unknown_id_names_the_running_ones(owner):
    with pytest.raises(ClusterError, match=rf"no cluster 'mlx-nope'.*running: {owner.cluster_id}"):
        Cluster.connect("mlx-nope", timeout=5)


def test_restart_and_start_stay_with_the_owner(owner):
    c = Cluster.connect(owner.cluster_id, timeout=30)
    try:
        with pytest.raises(ClusterError, match="restart it in that kernel.s notebook with %mlx_cluster restart"):
            c.restart()
        with pytest.raises(ClusterError, match="already running"):
            c.start()
    finally:
        c.stop()


def test_magic_connect_then_distributed_cell(owner, capsys):
    from IPython.testing.globalipapp import get_ipython

    from mlx_jupyter import magics

    ip = get_ipython()
    ip.run_line_magic("load_ext", "mlx_jupyter")
    magics.set_current(None)
    try:
        ip.run_line_magic("mlx_cluster", f"connect {owner.cluster_id}")
        assert f"connected to {owner.cluster_id}: 2 ranks" in capsys.readouterr().out
        ip.run_cell_magic("mlx_distributed", "",
                          "print('sum', mx.distributed.all_sum(mx.array([2.0]), group=world).item())")
        out = capsys.readouterr().out
        assert "sum 4.0" in out
        with pytest.raises(magics.UsageError) as refused:   # no "restarting: 0/2 ranks connected, then it failed" first
            ip.run_line_magic("mlx_cluster", "restart")
        assert str(refused.value).startswith(f"restart refused: {owner.cluster_id} belongs to "), refused.value
        assert "restart it in that kernel's notebook with %mlx_cluster restart" in str(refused.value)
        assert capsys.readouterr().out == ""
        ip.run_line_magic("mlx_cluster", "stop")
        assert "keeps running" in capsys.readouterr().out
        assert owner.running
    finally:
        magics.set_current(None)


def test_a_dead_rank_of_the_owner_fails_the_connected_cell_at_once(tmp_path_factory, owner):
    """The connected handle watches the owner's local ranks: a cell on a rank that dies ends, not waits."""
    c = Cluster.connect(owner.cluster_id, timeout=30)
    try:
        r = c.run("import time\ntime.sleep(60)")
        pid = owner.engine_set.launcher.ranks[1].pid
        os.kill(pid, signal.SIGKILL)
        assert r.wait(10), "the connected cell still waits for a rank that died"
        assert r.failed
        deadline = time.monotonic() + 5  # the watch looks every 0.2 s; the cell may have ended first
        while 1 not in c.dead and time.monotonic() < deadline:
            c.table.changed.wait(0.1)
        with pytest.raises(ClusterError, match="rank 1 is dead"):
            c.check_ranks([0, 1])
    finally:
        c.stop()
        owner.restart()


def test_a_cell_right_after_the_owners_restart_runs_on_the_new_ranks(tmp_path, monkeypatch):
    """The connected handle's watch looks every 0.2 s; a cell sent between its seeing the old ranks
    die and its seeing the owner's new publication looks again at once instead of calling them dead."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    with Cluster(n=2, timeout=60) as own:
        c = Cluster.connect(own.cluster_id, timeout=30)
        try:
            c.watch.stop()   # no background look: the state a slow watch leaves is made by hand
            c.watch.join(5)
            own.restart(timeout=60, quiet=True)
            for rank in (0, 1):   # the watch saw the old ranks die, not yet the new publication
                c.owner_rank_exited(rank, None)
            r = c.run("import os\npid = os.getpid()")
            assert r.wait(30) and not r.failed
            assert c.pull("pid") == [i.pid for i in own.engine_set.launcher.ranks]
        finally:
            c.stop()


OWNER_SCRIPT = """
import sys, time
from mlx_jupyter.cluster import Cluster
c = Cluster(n=1, timeout=60).start()
print(c.cluster_id, flush=True)
time.sleep(300)
"""


def test_stop_and_connect_after_the_owner_stopped_or_died(tmp_path, monkeypatch, capsys):
    """A connected cluster that no longer runs: `stop` does not say it keeps running, and `connect`
    to another one is not refused as if the dead one were in use (issue 30 §4.6)."""
    import subprocess
    import sys

    from IPython.testing.globalipapp import get_ipython

    from mlx_jupyter import magics

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    ip = get_ipython()
    ip.run_line_magic("load_ext", "mlx_jupyter")
    magics.set_current(None)
    dying = subprocess.Popen([sys.executable, "-c", OWNER_SCRIPT], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path)})
    try:
        with Cluster(n=1, timeout=60) as stopped:
            ip.run_line_magic("mlx_cluster", f"connect {stopped.cluster_id}")
            stopped.stop()   # as the panel's Stop does: the owner stops it, the notebook stays connected
            capsys.readouterr()
            ip.run_line_magic("mlx_cluster", "stop")
            out = capsys.readouterr().out
            assert "keeps running" not in out and "no longer runs: it was stopped where it was started" in out, out
        dying_id = dying.stdout.readline().strip()
        assert dying_id.startswith("mlx-"), dying_id
        ip.run_line_magic("mlx_cluster", f"connect {dying_id}")
        dying.kill()   # the owning kernel dies
        dying.wait(10)
        with Cluster(n=1, timeout=60) as other:
            capsys.readouterr()
            ip.run_line_magic("mlx_cluster", f"connect {other.cluster_id}")   # not "already uses a cluster"
            out = capsys.readouterr().out
            assert f"left {dying_id}, which no longer runs: the kernel that started it (pid {dying.pid}) has ended" \
                in out and f"connected to {other.cluster_id}" in out, out
            ip.run_line_magic("mlx_cluster", "stop")
            assert "keeps running" in capsys.readouterr().out  # this one does
    finally:
        magics.set_current(None)
        if dying.poll() is None:
            dying.kill()


def test_a_connected_cell_on_busy_ranks_says_whose_cell_holds_them_and_honours_timeout(owner, capsys):
    """The owner's cell holds the ranks: the connected notebook says so at once (whose, since when),
    gives up after --timeout without sending its cell, and the owner's cell goes on (issue 30 §4.1)."""
    from IPython.testing.globalipapp import get_ipython

    from mlx_jupyter import magics
    from mlx_jupyter.cluster import registry

    ip = get_ipython()
    ip.run_line_magic("load_ext", "mlx_jupyter")
    magics.set_current(None)
    try:
        ip.run_line_magic("mlx_cluster", f"connect {owner.cluster_id}")
        held = owner.run("import time\ntime.sleep(6)\nheld = 'done'")
        deadline = time.monotonic() + 10   # the owner lists a cell once it has run 0.3 s
        while not (registry.entry(owner.cluster_id) or {}).get("busy") and time.monotonic() < deadline:
            held.done.wait(0.05)
        capsys.readouterr()
        t0 = time.monotonic()
        with pytest.raises(magics.UsageError, match=r"the cell did not run: ranks 0-1 are running a cell of the "
                           rf"kernel with pid {os.getpid()} .*since \d\d:\d\d:\d\d.*within --timeout 1 s"):
            ip.run_cell_magic("mlx_distributed", "--timeout 1", "mine = 1")
        took = time.monotonic() - t0
        assert took < 4, f"gave up only after {took:.1f} s"   # 1 s asked; the margin is for a loaded machine
        out = capsys.readouterr().out
        assert out.startswith("waiting: ranks 0-1 are running a cell of the kernel with pid"), out
        assert held.wait(30) and not held.failed, "the owner's cell was disturbed"
        assert owner.pull("held") == ["done", "done"]
        ip.run_cell_magic("mlx_distributed", "--timeout 20", "mine = 2")   # free again: runs at once
        assert owner.pull("mine") == [2, 2]
        ip.run_line_magic("mlx_cluster", "stop")
    finally:
        magics.set_current(None)


def test_a_connected_notebooks_stop_error_says_where_the_ranks_were(owner):
    """Issue 45 §8: Stop pressed while a rank waits in a collective, in a notebook connected to another's cluster (its
    cells go through the controller, no samples come on their own): the error says where the ranks were, as the
    owning notebook's does."""
    import threading

    from tests.cluster.kernel import Kernel

    k = Kernel()
    try:
        res = k.run(f"%load_ext mlx_jupyter\n%mlx_cluster connect {owner.cluster_id}", 60)
        assert res.status == "ok" and "connected to" in res.stdout, res
        timers: list = []

        def on_output(name, text):
            if "ARMED" in text and not timers:   # rank 0 is about to wait in the all_sum for rank 1, asleep
                timers.append(threading.Timer(3.0, k.interrupt))
                timers[0].start()

        cell = ("%%mlx_distributed\nimport time, numpy as np\nfrom mlx_jupyter import distributed as dist\n"
                "print('ARMED', flush=True)\nif group.rank() == 1:\n    time.sleep(30)\n"
                "dist.all_sum(np.ones(4), group=group, timeout=60)")
        res = k.collect(k.submit(cell), 60, on_output)
        assert timers, res
        assert res.status == "error" and "interrupted by the user" in res.traceback, res
        assert "where the ranks were when stopped: rank 0 is in all_sum #" in res.traceback, res.traceback
        assert "waiting on rank 1" in res.traceback and "rank 1 is at line 6: time.sleep(30)" in res.traceback, \
            res.traceback
        ok = k.run("%%mlx_distributed\nprint(dist.all_sum(np.ones(2), group=group))", 30)
        assert ok.status == "ok" and "[2. 2.]" in ok.stdout, ok
        assert k.run("%mlx_cluster stop", 30).status == "ok"
    finally:
        k.close()
