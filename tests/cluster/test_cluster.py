"""mlx_jupyter.Cluster from plain Python: 2 local ranks, MLX code, failures, restart, stop."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from mlx_jupyter.cluster import Cluster
from mlx_jupyter.cluster.cells.display import DistributedCellError, show_run

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def runtime_dir(tmp_path_factory):
    """Jupyter's runtime dir for this module: where clusters publish themselves for the lab panel."""
    path = tmp_path_factory.mktemp("jupyter-runtime")
    old = os.environ.get("JUPYTER_RUNTIME_DIR")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("JUPYTER_RUNTIME_DIR", None)
    else:
        os.environ["JUPYTER_RUNTIME_DIR"] = old


def _published(c: Cluster) -> list[dict]:
    from mlx_jupyter.cluster import registry

    return [item for item in registry.published() if item["id"] == c.cluster_id]


@pytest.fixture(scope="module", params=["channel", "controller"])
def cluster(runtime_dir, request, descendants):
    """Every test here twice: cells straight to the ranks (the default), and through the controller."""
    before = descendants()
    c = Cluster(n=2, cell_channel=request.param == "channel").start(timeout=30)
    c.setup(timeout=30)
    yield c
    c.stop()
    assert _published(c) == [], "a stopped cluster is still listed for the lab panel"
    left = [p for p in descendants() - before if psutil.pid_exists(p)]
    assert not left, f"processes left behind: {left}"


def test_cluster_is_published_for_the_lab_panel(cluster):
    [item] = _published(cluster)
    assert item["owner"] == "kernel" and item["owner_pid"] == os.getpid() and item["size"] == 2
    assert [(r["rank"], r["pid"], r["health"]) for r in item["ranks"]] == \
        [(row["rank"], row["pid"], "idle") for row in cluster.status()]   # no cell runs: idle


def test_start_uses_our_controller_and_begins_mlx_world_after_the_probe(cluster):
    """The controller without ipyparallel's fixed pause; every rank asked to form MLX's world
    once it had answered the probe (not at engine start: MLX's init holds the GIL)."""
    assert "mlx_jupyter.cluster.ipcontroller" in cluster.ipp.controller.args
    cluster.client[:].execute("import mlx_jupyter.cluster.rank.world as _r\n_began = _r.EARLY_WORLD is not None", block=True)
    assert cluster.pull("_began") == [True, True] and cluster.forming_world() == []


def test_status_waits_a_moment_for_ranks_forming_the_world_then_says_so(cluster, tmp_path):
    """Right after start the ranks are busy forming MLX's world (see _begin_world): status
    gives them ``forming_grace`` s, then names the state rather than "busy"/"no reply"."""
    gate = tmp_path / "gate"
    startup = cluster.startup
    saved = startup.world_request
    startup.world_request = cluster.client[:].execute(  # stands in for a slow ring formation
        f"import os, time\nt_end = time.monotonic() + 20\n"
        f"while not os.path.exists({str(gate)!r}) and time.monotonic() < t_end:\n    time.sleep(0.01)", block=False)
    try:
        t0 = time.monotonic()
        rows = cluster.status(forming_grace=0.3)
        assert 0.3 <= time.monotonic() - t0 < 5
        assert [row["state"] for row in rows] == ["forming MLX world"] * 2, rows
        gate.touch()
        assert [row["state"] for row in cluster.status(forming_grace=10)] == ["idle", "idle"]
    finally:
        gate.touch()
        startup.world_request.get(10)
        startup.world_request = saved


def run(c: Cluster, code: str, timeout: float = 20):
    return show_run(c.run(code), timeout=timeout)


def test_cells_take_the_cell_channel_unless_it_is_off(cluster):
    r = cluster.run("x = 1")
    assert r.wait(10) and not r.failed
    assert r.via == ("channel" if cluster.cell_channel else "controller")
    if cluster.cell_channel:
        assert cluster.cell_server.connected([0, 1]) and sorted(cluster.cell_server.pids.values()) == \
            sorted(row["pid"] for row in cluster.status())


def test_all_a_cells_output_arrives_before_its_end(cluster):
    """Outputs go out from ipykernel's IOPub thread, the reply from the main thread: the
    reply must wait for the last of them (stdout and stderr, the last one unterminated)."""
    r = cluster.run("import sys\nfor i in range(300):\n    print(i)\n"
                    "sys.stderr.write('err')\nprint('last', end='')")
    assert r.wait(10) and not r.failed
    seen: dict = {}
    ended = set()
    while not r.events.empty():
        ev = r.events.get()
        if ev.kind == "end":
            ended.add(ev.rank)
        elif ev.kind == "stream":
            assert ev.rank not in ended, f"output of rank {ev.rank} after its end"
            seen.setdefault((ev.rank, ev.payload[0]), []).append(ev.payload[1])
    expected = "".join(f"{i}\n" for i in range(300)) + "last"
    for rank in (0, 1):
        assert "".join(seen[(rank, "stdout")]) == expected
        assert "".join(seen[(rank, "stderr")]) == "err"


def test_a_cell_runs_as_the_kernel_runs_it_await_input_history_errors_and_results(cluster):
    """The channel runs plain cells itself (rank.kernel_compat.run_plain_cell) and hands the rest
    to the kernel's do_execute: either way a cell behaves as in a notebook."""
    r = run(cluster, "import asyncio\nawait asyncio.sleep(0)\nawaited = world.rank() + 10")
    assert not r.failed and cluster.pull("awaited") == [10, 11]
    t0 = time.monotonic()
    with pytest.raises(DistributedCellError) as err:
        run(cluster, "input('name? ')")
    assert time.monotonic() - t0 < 10
    assert {o.ename for o in err.value.outcomes} == {"StdinNotImplementedError"}, err.value.outcomes
    run(cluster, "marker_cell = 1")
    run(cluster, "_last_in = In[-2] if len(In) > 1 else ''\n_n = len(In)\nshown = 7\nshown")
    assert cluster.pull("_last_in") == ["marker_cell = 1"] * 2, "the cell is in the rank's history"
    with pytest.raises(DistributedCellError) as err:
        run(cluster, "def f():\n    raise ValueError('on purpose')\nf()")
    outcome = err.value.outcomes[0]
    assert outcome.ename == "ValueError" and outcome.evalue == "on purpose"
    assert any("on purpose" in line for line in outcome.traceback) and \
        any("f()" in line for line in outcome.traceback), outcome.traceback
    with pytest.raises(DistributedCellError) as err:
        run(cluster, "def broken(:\n    pass")
    assert {o.ename for o in err.value.outcomes} == {"SyntaxError"}


def test_a_cell_awaiting_is_stopped_by_its_timeout_and_the_ranks_go_on(cluster):
    t0 = time.monotonic()
    with pytest.raises(DistributedCellError, match="timed out after 1 s") as err:
        show_run(cluster.run("import asyncio\nawait asyncio.sleep(60)"), timeout=1)
    assert time.monotonic() - t0 < 6
    assert [o.status for o in err.value.outcomes] == ["released"] * 2, err.value.outcomes
    assert {o.ename for o in err.value.outcomes} == {"KeyboardInterrupt"}, err.value.outcomes
    assert not run(cluster, "await asyncio.sleep(0)\nafter = 1").failed


def test_a_cell_after_a_request_still_running_through_the_controller_follows_it(cluster, tmp_path):
    """A cell sent beside the controller could overtake a ``%px`` still on its way or running:
    while one is unanswered on a target rank the cell takes the controller's path too."""
    gate = tmp_path / "gate"
    held = cluster.client[1].execute(
        "import os, time\norder = ['px']\nt_end = time.monotonic() + 20\n"
        f"while not os.path.exists({str(gate)!r}) and time.monotonic() < t_end:\n    time.sleep(0.01)",
        block=False)
    r = cluster.run("order.append('cell')", targets=[1])
    assert r.via == "controller"
    gate.touch()
    held.get(10)
    assert r.wait(10) and not r.failed
    assert cluster.pull("order", targets=[1]) == [["px", "cell"]]
    r = cluster.run("x = 1")
    assert r.wait(10) and r.via == ("channel" if cluster.cell_channel else "controller")


def test_a_rank_missing_from_the_channel_gets_its_cells_through_the_controller(cluster):
    if not cluster.cell_channel:  # off: there is no channel to miss a rank
        assert cluster.cell_server is None and cluster.channel_for() is None
        return
    saved = dict(cluster.cell_server.idents)
    cluster.cell_server.idents.pop(1)
    try:
        r = cluster.run("import os\nwhere = os.getpid()")
        assert r.wait(10) and not r.failed and r.via == "controller"
    finally:
        cluster.cell_server.idents.update(saved)
    r = cluster.run("where2 = where")
    assert r.wait(10) and not r.failed and r.via == "channel"
    assert cluster.pull("where2") == [row["pid"] for row in cluster.status()]


def test_engine_id_is_rank_and_mlx_env(cluster):
    assert cluster.client.ids == [0, 1]
    run(cluster, "import os\nenv_rank = int(os.environ['MLX_RANK'])")
    assert cluster.pull("env_rank") == [0, 1]
    assert cluster.ready_time is not None and cluster.ready_time < 10


def test_ranks_kernel_is_built_without_debugpy_which_cells_can_still_import(cluster):
    run(cluster, "import sys\nhad_debugpy = sys.modules.get('debugpy', 0) is not 0\n"
                 "import debugpy\ncan_listen = callable(debugpy.listen)")
    assert cluster.pull("had_debugpy") == [False, False]
    assert cluster.pull("can_listen") == [True, True]


def test_mlx_all_sum_and_data(cluster, capsys):
    run(cluster, "x = mx.distributed.all_sum(mx.array([world.rank() + 1.0])).item()")
    assert cluster.pull("x") == [3.0, 3.0]
    cluster.push({"a": 5})
    assert cluster.pull("a", targets=[1]) == [5]
    cluster.scatter("part", list(range(6)))
    assert cluster.pull("part") == [[0, 1, 2], [3, 4, 5]]
    assert cluster.gather("part") == list(range(6))


def test_group_is_our_core(cluster):
    run(cluster, "import numpy as np, mlx_jupyter.distributed as d\ns = d.all_sum(np.ones(2) * (group.rank() + 1))")
    assert [list(v) for v in cluster.pull("s")] == [[3.0, 3.0], [3.0, 3.0]]


#: the no-hang promise: from the event (error, death, interrupt) to the end of the cell
PROMISE = 2.0


@pytest.mark.parametrize("collective", [
    "d.all_sum(np.ones(3))",                                   # our core: abort releases it
    "mx.eval(mx.distributed.all_sum(mx.ones(3)))",             # MLX: its sockets are closed
])
def test_rank_raising_releases_the_blocked_rank(cluster, collective):
    if any(row.get("world_closed") for row in cluster.status()):
        cluster.restart(timeout=30)
        cluster.setup(timeout=30)
    if cluster.needs_reform:
        cluster.reform()
    with pytest.raises(DistributedCellError) as err:
        # both ranks pass a barrier; then rank 1 raises while rank 0 goes straight into the collective
        run(cluster, "import time, numpy as np, mlx_jupyter.distributed as d\ngroup.barrier()\n"
                     f"if world.rank() == 1:\n    t_err = time.monotonic()\n    1/0\n{collective}")
    ended = time.monotonic()
    [t_err] = cluster.pull("t_err", targets=[1])
    assert ended - t_err <= PROMISE, f"released {ended - t_err:.2f} s after rank 1 raised"
    outcomes = {o.rank: o for o in err.value.outcomes}
    assert outcomes[1].status == "error" and outcomes[1].ename == "ZeroDivisionError"
    assert outcomes[0].status == "released" and "rank 1 raised ZeroDivisionError" in outcomes[0].note
    cluster.reform()
    run(cluster, "ok = d.all_sum(np.ones(1))[0]")
    assert cluster.pull("ok") == [2.0, 2.0]


@pytest.mark.parametrize("blocked", [
    "d.recv(3, 'float64', src=1 - group.rank())",                          # our core
    "mx.eval(mx.distributed.recv_like(mx.ones(3), src=1 - group.rank()))",  # MLX's ring
])
def test_interrupt_releases_every_rank_inside_collectives(cluster, blocked):
    """Both ranks wait to receive from each other (nobody sends): the stop ends both."""
    if any(row.get("world_closed") for row in cluster.status()):
        cluster.restart(timeout=30)
        cluster.setup(timeout=30)
    if cluster.needs_reform:
        cluster.reform()
    r = cluster.run("import numpy as np, mlx_jupyter.distributed as d\nprint('armed', flush=True)\n" + blocked)
    armed = set()
    while len(armed) < 2:  # both ranks on their way into the receive; the race of one not started
        ev = r.next_event(10)  # yet is test_interrupt_before_a_rank_started_the_cell...
        assert ev is not None, armed
        if ev.kind == "stream":
            armed.add(ev.rank)
    t0 = time.monotonic()
    r.interrupt()
    assert r.wait(5)
    assert time.monotonic() - t0 <= PROMISE
    assert {o.status for o in r.outcomes.values()} == {"released"}, r.outcomes
    cluster.reform()
    run(cluster, "ok = d.all_sum(np.ones(1))[0]")
    assert cluster.pull("ok") == [2.0, 2.0]


def test_interrupt_before_a_rank_started_the_cell_keeps_it_from_running(cluster, tmp_path):
    """Regression (CI): the stop came while rank 1 had not begun the cell yet (here: busy
    with an earlier request). That rank used to run the whole cell afterwards; now the
    cell is answered "not run" there and the run ends within the release deadline."""
    if cluster.needs_reform:
        cluster.reform()
    gate = tmp_path / "gate"
    hold = ("import os, time\nt_end = time.monotonic() + 20\n"
            f"while not os.path.exists({str(gate)!r}) and time.monotonic() < t_end:\n    time.sleep(0.01)")
    if cluster.cell_channel:  # held by a cell of its own: the next one waits on the rank itself
        wait_held = cluster.run(hold, targets=[1]).wait
    else:
        wait_held = cluster.client[1].execute(hold, block=False).get
    # ran_here before the print: a rank's flush waits for its output thread, so the
    # interrupt, sent once 'armed' arrives, can land inside print() itself
    abort_replies: dict = {}   # what each rank answered the stop (the run itself keeps no record of it)
    send_abort = cluster.send_abort
    cluster.send_abort = lambda *a, **k: abort_replies.update(send_abort(*a, **k)) or abort_replies
    r = cluster.run("import numpy as np, mlx_jupyter.distributed as d\nran_here = True\n"
                    "print('armed', flush=True)\nd.all_sum(np.ones(3))")
    ev = r.next_event(10)
    assert ev is not None and ev.kind == "stream" and ev.rank == 0
    assert r.via == ("channel" if cluster.cell_channel else "controller")
    try:
        r.interrupt()
    finally:
        del cluster.send_abort   # the class's own again
    # the precondition, not a race with the gate: rank 1 got the stop while still held
    assert abort_replies[1].result(5)["content"]["was_running"] is False
    gate.touch()
    assert r.wait(5)
    wait_held(10)
    assert r.outcomes[0].status == "released"
    assert r.outcomes[1].status == "released" and r.outcomes[1].note.startswith("not run"), r.outcomes[1]
    cluster.client[:].execute("ran = 'ran_here' in globals()", block=True)
    assert cluster.pull("ran") == [True, False]


def test_status_says_when_each_rank_began_its_cell_and_a_late_widget_counts_from_there(cluster, tmp_path):
    """A rank's status reply carries its current cell's start (time.time()); Cluster.status
    passes it on, so a ClusterStatusWidget opened in the middle of a cell counts the
    cell's time from its start, not from the widget's first look."""
    from mlx_jupyter.widgets import ClusterStatusWidget

    if cluster.needs_reform:
        cluster.reform()
    gate = tmp_path / "gate"
    sent = time.time()
    r = cluster.run("import os, time\nprint('running', flush=True)\nt_end = time.monotonic() + 20\n"
                    f"while not os.path.exists({str(gate)!r}) and time.monotonic() < t_end:\n    time.sleep(0.01)")
    try:
        seen = set()
        while len(seen) < 2:  # both ranks inside the cell
            ev = r.next_event(10)
            assert ev is not None, seen
            if ev.kind == "stream":
                seen.add(ev.rank)
        rows = cluster.status()
        assert [row["state"] for row in rows] == ["busy", "busy"], rows
        assert all(sent - 0.05 <= row["cell_started"] <= time.time() for row in rows), (sent, rows)
        w = ClusterStatusWidget(cluster, autostart=False)  # opened mid-cell: the rank's own start time
        try:
            assert [row["busy_since"] for row in w.rows] == [row["cell_started"] for row in rows], (w.rows, rows)
        finally:
            w.close()
    finally:
        gate.touch()
        assert r.wait(10)
    assert [row["cell_started"] for row in cluster.status()] == [None, None]


def test_back_to_back_runs_all_end(cluster):
    """Regression: every run's replies are read. CellRun used to send its execute
    requests raw on the client's mux socket, bypassing the ZMQStream that reads it;
    such a send can eat the socket's edge-triggered read event, and the replies
    then sat unread for good (both ranks idle, no reply: the cell never ended).
    That happened within the first ~100 of these runs."""
    if cluster.needs_reform:
        cluster.reform()
    deadline = time.monotonic() + 30
    for i in range(1000):
        r = cluster.run(f"i = {i}")
        assert r.wait(5), f"run {i} never ended: replied {sorted(r._replied)}, idle {sorted(r._idle)}"
        assert not r.failed, [r.outcomes[k] for k in r.ranks]
        if time.monotonic() > deadline:
            break
    assert cluster.pull("i") == [i, i]


def test_rank_death_is_reported_then_restart_keeps_ids(cluster, tmp_path):
    if any(row.get("world_closed") for row in cluster.status()):
        cluster.restart(timeout=30)
        cluster.setup(timeout=30)
    if cluster.needs_reform:
        cluster.reform()
    died = tmp_path / "died"
    with pytest.raises(DistributedCellError) as err:
        run(cluster, "import os, signal, time, numpy as np, mlx_jupyter.distributed as d\n"
                     f"if group.rank() == 1:\n    open({str(died)!r}, 'w').write(repr(time.monotonic()))\n"
                     "    os.kill(os.getpid(), signal.SIGKILL)\nd.all_sum(np.ones(3))")
    named = time.monotonic() - float(died.read_text())
    assert named <= PROMISE, f"named {named:.2f} s after the death"
    outcomes = {o.rank: o for o in err.value.outcomes}
    assert outcomes[1].status == "died" and "restart" in outcomes[1].note
    old = cluster.status()[0]["pid"]
    cluster.restart(timeout=30)
    assert cluster.client.ids == [0, 1]
    assert cluster.status()[0]["pid"] != old
    [item] = _published(cluster)  # republished with the new processes
    assert [r["pid"] for r in item["ranks"]] == [row["pid"] for row in cluster.status()]
    cluster.setup()
    run(cluster, "y = mx.distributed.all_sum(mx.ones(1)).item()")
    assert cluster.pull("y") == [2.0, 2.0]
    r = cluster.run("z = 1")  # the restarted ranks are back on the channel
    assert r.wait(10) and r.via == ("channel" if cluster.cell_channel else "controller")
