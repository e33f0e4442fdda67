"""A controller killed under a live cluster: named at once (next cell, status), restart works, and no
process of it (its forked child included) outlives ``stop()`` or the notebook's death."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from mlx_jupyter import Cluster
from mlx_jupyter.cluster.shared.errors import ClusterError
from tests.cluster.kernel import Kernel, alive, kill_leftovers

pytestmark = pytest.mark.timeout(180)

#: the issue's bound for naming the controller as the cause (HEAD waited 65 s, then blamed the setup)
NAMED_WITHIN = 5.0


def controller_group(c: Cluster) -> list[int]:
    pid = c.ipp.controller.pid
    return [pid] + [p.pid for p in psutil.Process(pid).children(recursive=True)]


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    end = time.monotonic() + timeout
    while alive(pids) and time.monotonic() < end:
        time.sleep(0.05)
    return alive(pids)


def isolated(body: str, timeout: float = 150) -> str:
    """Run ``body`` (a test's code, with this module's helpers) in a fresh Python: a controller killed
    in pytest's own process left it unable to interrupt later clusters' requests (ipyparallel's
    state), so the kill happens in a process of its own. Its output, or a failure showing it."""
    prelude = textwrap.dedent('''
        import os, signal, time
        import psutil
        from mlx_jupyter import Cluster
        from mlx_jupyter.cluster.shared.errors import ClusterError
        from tests.cluster.test_dead_controller import NAMED_WITHIN, controller_group, wait_gone
    ''')
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)], cwd=root, text=True,
                          capture_output=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_a_killed_controller_is_named_at_the_next_cell_and_in_status_and_restart_works():
    out = isolated('''
        c = Cluster(n=2, timeout=60).start()
        group = []
        try:
            group = controller_group(c)
            assert len(group) >= 2, "the controller forks a child of its own (what was orphaned)"
            os.kill(group[0], signal.SIGKILL)
            t0 = time.monotonic()
            try:
                c.run("x = 1")
                raise AssertionError("the cell ran")
            except ClusterError as err:
                text = str(err)
            assert time.monotonic() - t0 < NAMED_WITHIN, time.monotonic() - t0
            assert f"the cluster's controller (pid {group[0]}) is dead" in text, text
            assert "cluster.restart()" in text, text
            t0 = time.monotonic()
            rows = c.status()
            assert time.monotonic() - t0 < NAMED_WITHIN
            assert [r["state"].split(":")[0] for r in rows] == ["unreachable", "unreachable"], rows
            assert all("controller" in r["state"] and "restart" in r["state"] for r in rows), rows
            t0 = time.monotonic()
            c.restart()
            took = time.monotonic() - t0
            assert "a new controller" in c.last_restart, c.last_restart
            # both live ranks saved over the cell channel (a rank that did not answer would cost its names and
            # the save's whole 120-s wait: once seen in CI as a 123-s test, the line unchecked)
            assert "on 2 ranks" in c.last_restart and "not kept" not in c.last_restart, (took, c.last_restart)
            assert c.execute("1 + 1", timeout=60) == ["2", "2"]
        finally:
            c.stop()
        assert wait_gone(group, 5) == [], "the old controller's child outlived the restart and stop"
        print("ok")
    ''')
    assert out.strip().endswith("ok"), out


def test_a_restart_after_a_dead_controller_keeps_the_live_ranks_variables():
    """The save goes over the cell channel: a dead controller no longer costs the ranks' names."""
    out = isolated('''
        c = Cluster(n=2, timeout=60).start()
        try:
            c.run("import numpy as np\\nimport mlx.nn as nn\\nr = world.rank()\\n"
                  "shard = np.full(4, r, dtype=np.float32)\\nw = mx.arange(3, dtype=mx.float32) * 2\\n"
                  "model = nn.Linear(3, 2)\\nmx.eval(model.parameters())\\n"
                  "fp = np.array(model(w)).tobytes().hex()").wait(60)
            before = c.pull("fp", timeout=30)
            group = controller_group(c)
            os.kill(group[0], signal.SIGKILL)
            wait_gone(group[:1], 5)
            c.restart()
            line = c.last_restart
            assert line.startswith("restart: kept ") and "a new controller replaced the dead one" in line, line
            assert "not kept" not in line, line
            assert c.execute("int(shard.sum()), float(w.sum().item()), np.array(model(w)).tobytes().hex() == fp",
                             timeout=60) == ["(0, 6.0, True)", "(4, 6.0, True)"]
            assert c.pull("fp", timeout=30) == before
        finally:
            c.stop()
        print("ok")
    ''')
    assert out.strip().endswith("ok"), out


def test_the_controllers_orphaned_child_does_not_outlive_stop():
    out = isolated('''
        c = Cluster(n=2, timeout=60).start()
        group = controller_group(c)
        os.kill(group[0], signal.SIGKILL)
        wait_gone(group[:1], 5)
        c.stop()
        assert wait_gone(group, 5) == [], group
        print("ok")
    ''')
    assert out.strip().endswith("ok"), out


def test_no_process_of_the_controller_outlives_a_killed_notebook(tmp_path):
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent("""
        import sys, time, psutil
        from mlx_jupyter import Cluster
        c = Cluster(n=2, timeout=60).start()
        pid = c.ipp.controller.pid
        print(" ".join(str(p) for p in [pid] + [k.pid for k in psutil.Process(pid).children(recursive=True)]),
              flush=True)
        time.sleep(600)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    group: list[int] = []
    try:
        line = proc.stdout.readline()
        group = [int(p) for p in line.split()]
        assert len(group) >= 2, line
        os.kill(group[0], signal.SIGKILL)   # the controller first: its child is orphaned
        wait_gone(group[:1], 5)
        proc.kill()                         # then the notebook
        proc.wait(10)
        assert wait_gone(group, 10) == [], "a process of the controller outlived the notebook"
    finally:
        proc.kill()
        kill_leftovers(group)


def test_a_notebook_names_the_dead_controller_at_the_next_cell_and_in_status():
    k = Kernel()
    try:
        res = k.run("%load_ext mlx_jupyter\n%mlx_cluster start -n 2", timeout=120)
        assert res.status == "ok", res
        res = k.run("from mlx_jupyter import magics\nimport os, signal\n"
                    "os.kill(magics.current().ipp.controller.pid, signal.SIGKILL)", timeout=30)
        assert res.status == "ok", res
        res = k.run("%%mlx_distributed\nx = 1", timeout=30)
        assert res.elapsed < NAMED_WITHIN, res.elapsed
        text = res.traceback + res.stdout + res.stderr
        assert "controller" in text and "is dead" in text and "%mlx_cluster restart" in text, text
        res = k.run("%mlx_cluster status", timeout=30)
        text = res.stdout + res.stderr + str(res.displays)
        assert "controller" in text and "is dead" in text, text
        res = k.run("%mlx_cluster restart", timeout=120)
        assert res.status == "ok", res
        res = k.run("%%mlx_distributed\nprint('back', world.rank())", timeout=60)
        assert res.status == "ok" and "back 1" in res.stdout, res
    finally:
        k.run("%mlx_cluster stop", timeout=60)
        k.close()


def test_a_connected_handle_names_the_owners_dead_controller(tmp_path):
    out = isolated(f'''
        os.environ["JUPYTER_RUNTIME_DIR"] = {str(tmp_path)!r}
        owner = Cluster(n=2, timeout=60).start()
        connected = None
        try:
            connected = Cluster.connect(owner.cluster_id, timeout=30)
            pid = owner.ipp.controller.pid
            os.kill(pid, signal.SIGKILL)
            wait_gone([pid], 5)
            t0 = time.monotonic()
            try:
                connected.run("x = 1")
                raise AssertionError("the cell ran")
            except ClusterError as err:
                text = str(err)
            assert time.monotonic() - t0 < NAMED_WITHIN
            assert f"the cluster's controller (pid {{pid}}, started by" in text, text
            assert "restart" in text, text
            assert all(r["state"].startswith("unreachable: the cluster's controller") for r in connected.status())
        finally:
            if connected is not None:
                connected.stop()
            owner.stop()
        print("ok")
    ''')
    assert out.strip().endswith("ok"), out


def test_a_controller_killed_mid_cell_ends_the_cells_through_it_within_5_s_naming_it(tmp_path):
    """A cell through the controller (``cell_channel=False``, and every connected notebook's) used to
    wait for good once the controller was SIGKILLed under it (issue 44 §3): it ends, naming it."""
    out = isolated(f'''
        os.environ["JUPYTER_RUNTIME_DIR"] = {str(tmp_path)!r}
        from mlx_jupyter.cluster.cells.display import DistributedCellError, show_run
        owner = Cluster(n=2, timeout=60, cell_channel=False).start()
        connected = None
        try:
            assert owner.execute("world.rank()", timeout=60) == ["0", "1"]
            connected = Cluster.connect(owner.cluster_id, timeout=30)
            assert connected.execute("world.rank()", timeout=60) == ["0", "1"]
            cell = "import time\\nprint('in', flush=True)\\ntime.sleep(120)"
            runs = [owner.run(cell, [0]), connected.run(cell, [1])]
            for run in runs:
                assert run.via == "controller", run.via
                ev = run.next_event(60)
                while ev is None or ev.kind != "stream":
                    ev = run.next_event(60)
            pid = owner.ipp.controller.pid
            os.kill(pid, signal.SIGKILL)
            t0 = time.monotonic()
            for run in runs:
                try:
                    show_run(run, live=None)
                    raise AssertionError("the cell ended well")
                except DistributedCellError as err:
                    text = str(err) + "\\n".join(err.lines)
                assert time.monotonic() - t0 < NAMED_WITHIN, time.monotonic() - t0
                assert f"the cluster's controller (pid {{pid}}" in text and "is dead" in text, text
                assert "restart" in text, text
        finally:
            if connected is not None:
                connected.stop()
            owner.stop()
        print("ok")
    ''')
    assert out.strip().endswith("ok"), out


def test_the_controllers_forked_child_ends_with_it_before_any_stop():
    """Issue 44 §4: the heart monitor the controller forks sat orphaned until ``stop()``."""
    out = isolated('''
        c = Cluster(n=2, timeout=60).start()
        try:
            group = controller_group(c)
            assert len(group) >= 2, group
            os.kill(group[0], signal.SIGKILL)
            assert wait_gone(group, 3) == [], "the controller's child outlived it"
        finally:
            c.stop()
        print("ok")
    ''')
    assert out.strip().endswith("ok"), out


def test_the_guard_kills_no_process_whose_start_differs_from_the_one_it_recorded():
    """A recycled pid: the guard's controller pid and its member's name live processes of this test
    (each leading its own group, as a reused pid's new owner may) with other start times; ``end()``
    leaves them alive, and kills them once the starts are their own."""
    from types import SimpleNamespace

    from mlx_jupyter.cluster.controller_guard import ControllerGuard
    from mlx_jupyter.proc_identity import start_token

    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                              start_new_session=True) for _ in range(2)]
    try:
        guard = ControllerGuard(SimpleNamespace(pid=procs[0].pid, connection_files={}), watchdog=False)
        assert guard.pgid == procs[0].pid and guard.token == start_token(procs[0].pid)
        guard.token = "1"   # recorded for an earlier process of that pid
        guard.members = {procs[1].pid: "1"}
        guard.end()
        assert [p.poll() for p in procs] == [None, None], "the guard killed a process it did not start"
        guard.token, guard.members = start_token(procs[0].pid), {procs[1].pid: start_token(procs[1].pid)}
        guard.end()
        assert [p.wait(5) for p in procs] == [-signal.SIGKILL, -signal.SIGKILL]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
