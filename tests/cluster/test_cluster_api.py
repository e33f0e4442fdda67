"""The plain-Python ways in: the ``mlx`` entry point, ``ipp.Cluster(engines="mlx")``,
``with mlx_jupyter.Cluster(...)``; the ipyparallel compatibility check; the stop
button during setup and push."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import threading
import time

import ipyparallel as ipp
import psutil
import pytest

import mlx_jupyter
from mlx_jupyter import cluster as cluster_mod
from mlx_jupyter.cluster.rank import agent as rankside
from mlx_jupyter.cluster import Cluster, ClusterError
from mlx_jupyter.cluster.cells.display import show_run

pytestmark = pytest.mark.timeout(90)


def _alive(pids: set[int]) -> list[int]:
    """Those of ``pids`` still running (zombies waiting for their parent count as gone)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            pass
    return alive


def test_entry_point_names_the_mlx_engine_launcher():
    [ep] = [e for e in importlib.metadata.entry_points(group="ipyparallel.engine_launchers") if e.name == "mlx"]
    assert ep.load() is cluster_mod.MLXEngineSetLauncher


def test_ipyparallel_cluster_with_mlx_engines(descendants):
    """Plain ipyparallel: engine ids are the MLX ranks, and each engine has its rank's environment."""
    before = descendants()
    c = ipp.Cluster(engines="mlx", n=2, log_level=40)
    try:
        rc = c.start_and_connect_sync()
        rc.wait_for_engines(2, timeout=30)
        assert sorted(rc.ids) == [0, 1]
        view = rc.direct_view(targets=[0, 1])
        view.execute("import os\nr = (int(os.environ['MLX_RANK']), os.environ['MLX_JUPYTER_SIZE'])", block=True)
        assert view.pull("r", block=True) == [(0, "2"), (1, "2")]
        rc.close()
    finally:
        c.stop_cluster_sync()
    deadline = time.monotonic() + 5
    while _alive(descendants() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(descendants() - before), _alive(descendants() - before)


def test_context_manager_view_in_rank_order_and_nothing_left_after(descendants):
    before = descendants()
    with mlx_jupyter.Cluster(n=2) as c:
        view = c.view
        assert list(view.targets) == [0, 1]
        view.execute("import os\nr = int(os.environ['MLX_RANK'])")
        assert view.pull("r") == [0, 1]
        assert c.ready_time is not None
    assert not c.running
    assert not _alive(descendants() - before), _alive(descendants() - before)


def test_missing_ipyparallel_internals_fail_start_before_anything_runs(monkeypatch, descendants):
    monkeypatch.delattr(ipp.Client, "_build_targets")
    before = descendants()
    with pytest.raises(ClusterError) as err:
        Cluster(n=2).start(timeout=10)
    msg = str(err.value)
    assert "Client._build_targets" in msg and "install ipyparallel 9.x" in msg, msg
    assert not _alive(descendants() - before)


def test_missing_client_streams_are_named(monkeypatch):
    class Bare:
        pass

    problems = cluster_mod.ipyparallel_problems(Bare())
    assert "Client()._control_stream" in problems and "Client()._mux_stream" in problems


def test_a_rank_without_its_agent_fails_start_naming_it(tmp_path, descendants):
    """The engine could not hook into its kernel (another ipyparallel's internals): start says so."""
    (tmp_path / "sitecustomize.py").write_text(
        "import mlx_jupyter.cluster.rank.agent as r\n"
        "def install(kernel, rank, env=None):\n"
        "    raise RuntimeError(\"the engine's kernel has no control_handlers (simulated)\")\n"
        "r.install = install\n")
    before = descendants()
    with pytest.raises(ClusterError) as err:
        Cluster(n=2, env={"PYTHONPATH": str(tmp_path)}).start(timeout=30)
    msg = str(err.value)
    assert "rank 0: the rank agent (abort, status) is not installed" in msg, msg
    assert "no control_handlers (simulated)" in msg and "install ipyparallel 9.x" in msg, msg
    assert not _alive(descendants() - before)


def test_a_rank_off_the_cell_channel_is_logged_with_its_reason_and_still_runs_cells(tmp_path, caplog, descendants):
    """A rank whose direct channel could not be set up: start logs the rank's own reason, and
    its cells take the controller's path."""
    (tmp_path / "sitecustomize.py").write_text(
        "import mlx_jupyter.cluster.rank.channel as ch\n"
        "def start(kernel, rank, interface, port):\n"
        "    if rank == 1:\n"
        "        raise OSError('no route to the notebook (simulated)')\n"
        "    return _start(kernel, rank, interface, port)\n"
        "_start, ch.start = ch.start, start\n")
    before = descendants()
    c = Cluster(n=2, env={"PYTHONPATH": str(tmp_path)})
    try:
        with caplog.at_level("WARNING", logger="mlx_jupyter.cluster"):
            c.start(timeout=60)
        warned = [r.getMessage() for r in caplog.records if "not on the direct cell channel" in r.getMessage()]
        assert warned and "rank 1: OSError: no route to the notebook (simulated)" in warned[0], caplog.text
        assert "rank 0" not in warned[0], warned
        ran = show_run(c.run("import os\nr = int(os.environ['MLX_RANK'])"), timeout=60)
        assert ran.via == "controller"
        assert c.pull("r") == [0, 1]
    finally:
        c.stop()
    assert not _alive(descendants() - before)


def test_agent_state_without_an_agent_says_why(monkeypatch):
    monkeypatch.setattr(rankside, "AGENT", None)
    monkeypatch.setattr(rankside, "AGENT_ERROR", "")
    state = rankside.agent_state()
    assert not state["installed"] and "complete_registration was not called" in state["error"]


def test_hosts_and_hostfile_together_are_refused():
    with pytest.raises(ValueError, match="give hosts or a hostfile, not both"):
        Cluster(hosts="a,b", hostfile="/tmp/hosts.json")


def test_expected_size_counts_the_hostfile(tmp_path):
    hf = tmp_path / "hosts.json"
    hf.write_text('[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}, '
                  '{"ssh": "c", "ips": ["10.0.0.3"]}]')
    assert Cluster(n=1, hostfile=str(hf)).expected_size() == 3
    assert Cluster(n=2, hostfile=str(hf)).expected_size() == 6
    assert Cluster(n=2, hosts="a,b").expected_size() == 4


def test_our_controller_skips_init_hubs_fixed_pause_and_only_that(monkeypatch):
    """ipyparallel 9's init_hub sleeps 0.25 s before writing the connection files everyone
    waits for (and sleeps nowhere else in that module); ours skips it, time stays time."""
    from ipyparallel.controller import app

    from mlx_jupyter.cluster import ipcontroller as controller

    seen = {}

    def init_hub(self):
        t0 = time.monotonic()
        app.time.sleep(5)
        seen["slept"], seen["clock"] = time.monotonic() - t0, app.time.monotonic()

    monkeypatch.setattr(app.IPController, "init_hub", init_hub)
    controller.MLXController.init_hub(object.__new__(controller.MLXController))
    assert seen["slept"] < 1 and seen["clock"] > 0
    assert app.time is time  # restored


@pytest.mark.skipif(not hasattr(psutil.Process, "memory_maps"), reason="psutil lists mapped files only on some systems")
def test_our_controller_does_not_load_numpy_and_ranks_still_do():
    """The controller (on the ready path) skips numpy, which only ipyparallel's unused
    "weighted" scheduler wants; the ranks keep it, and a cell using it runs."""
    with mlx_jupyter.Cluster(n=2) as c:
        controllers = [psutil.Process(p) for p in c.processes.pids()
                       if "mlx_jupyter.cluster.ipcontroller" in " ".join(psutil.Process(p).cmdline())]
        assert controllers
        for proc in controllers:
            assert not [m.path for m in proc.memory_maps() if "_multiarray_umath" in m.path]
        c.view.execute("import numpy as np\ns = int(np.arange(4).sum())", block=True)
        assert c.view.pull("s", block=True) == [6, 6]


def test_our_controller_writes_connection_files_atomically(tmp_path):
    import json
    import stat
    from types import SimpleNamespace

    from mlx_jupyter.cluster import ipcontroller as controller

    me = SimpleNamespace(profile_dir=SimpleNamespace(security_dir=str(tmp_path)),
                         log=SimpleNamespace(info=lambda *a: None))
    controller.MLXController.save_connection_dict(me, "ipcontroller-x-client.json", {"key": "k", "ports": [1, 2]})
    path = tmp_path / "ipcontroller-x-client.json"
    assert json.loads(path.read_text()) == {"key": "k", "ports": [1, 2]}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_rank_engine_starts_its_heart_from_the_registration_reply():
    """A rank's engine starts its heart as soon as the hub's registration reply arrives (before
    its kernel is built: the hub lists an engine only after its heart answers), with the hub's
    ping/pong addresses and period; a failed reply leaves the failure to ipyparallel."""
    from types import SimpleNamespace

    from jupyter_client.session import Session

    from mlx_jupyter.cluster.rank.engine import MLXEngine

    session = Session(key=b"secret")
    started: list = []
    me = SimpleNamespace(session=session, bident=b"engine-0", start_heartbeat=lambda *a: started.append(a),
                         connection_info={"interface": "tcp://127.0.0.1", "hb_ping": 5001, "hb_pong": 5002},
                         log=SimpleNamespace(debug=lambda *a: None))

    def reply(status: str) -> list:
        return session.serialize(session.msg("registration_reply",
                                             content={"status": status, "id": 0, "hb_period": 50}))

    MLXEngine._beat_early(me, reply("error"), lambda url: url)
    MLXEngine._beat_early(me, [b"garbage"], lambda url: url)  # unreadable: left to ipyparallel too
    assert started == []
    MLXEngine._beat_early(me, reply("ok"), lambda url: url + "?tunnelled")
    assert started == [("tcp://127.0.0.1:5001?tunnelled", "tcp://127.0.0.1:5002?tunnelled", 50, b"engine-0")]


def test_the_controller_does_not_outlive_a_killed_kernel():
    """Regression: ipyparallel's controller (and its heart monitor) stayed, re-parented to
    init, when the process that started the cluster was SIGKILLed. Ours watches its parent."""
    import subprocess
    import sys

    code = ("import time\nfrom mlx_jupyter.cluster import Cluster\nCluster(n=2).start(timeout=30)\n"
            "print('up', flush=True)\ntime.sleep(60)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    tree: list = []
    try:
        assert owner.stdout.readline().strip() == "up"
        tree = psutil.Process(owner.pid).children(recursive=True)
        controllers = [p for p in tree if "mlx_jupyter.cluster.ipcontroller" in " ".join(p.cmdline())]
        assert controllers, [p.cmdline() for p in tree]
        owner.kill()
        owner.wait(10)
        _, alive = psutil.wait_procs(controllers, timeout=5)  # its watch looks every 0.5 s
        assert not alive, [p.pid for p in alive]
    finally:
        owner.kill()
        for p in tree:
            try:
                p.kill()
            except psutil.Error:
                pass


def test_engine_set_tells_ipyparallel_a_failure_only_for_ranks_that_ended_by_themselves():
    """A stop or restart (the ranks KILLED by our launcher) is reported to ipyparallel as
    exit_code 0, which it logs quietly; a rank that died by itself is still its exit_code
    (ipyparallel then warns, with the ranks' output). Each rank's code is kept."""
    from types import SimpleNamespace

    from mlx_jupyter.vocab.rankinfo import EXITED, KILLED, LOST, RUNNING, RankInfo

    es = cluster_mod.MLXEngineSetLauncher()
    es.launcher = SimpleNamespace(ranks=[RankInfo(0, "h", 10, KILLED, -15), RankInfo(1, "h", 11, KILLED, 0)])
    assert es.stop_data_now() == {"exit_code": 0, "ranks": {0: -15, 1: 0}, "stopped": [0, 1]}
    es.launcher.ranks[1] = RankInfo(1, "h", 11, EXITED, -11)  # a segfault before the stop
    assert es.stop_data_now() == {"exit_code": -11, "ranks": {0: -15, 1: -11}, "stopped": [0]}
    es.launcher.ranks[1] = RankInfo(1, "h", None, LOST, None)
    assert es.stop_data_now()["exit_code"] == 255
    es.launcher.ranks[1] = RankInfo(1, "h", 11, RUNNING, None)  # not ended: nobody's failure yet
    assert es.stop_data_now()["exit_code"] == 0


def test_engine_set_stops_once_every_rank_has_ended_not_when_marked_killed():
    """Regression: a rank being stopped is KILLED (done) before its process ends; ipyparallel
    was told the set had stopped while that rank's code was still unknown (None)."""
    from types import SimpleNamespace

    import traitlets

    from mlx_jupyter.vocab.rankinfo import KILLED, RankInfo

    class Loop:
        def __init__(self):
            self.callbacks = []

        def add_callback(self, f):
            self.callbacks.append(f)

    class EngineSet(cluster_mod.MLXEngineSetLauncher):
        loop = traitlets.Any()

    es = EngineSet()
    es.loop = Loop()
    es.launcher = SimpleNamespace(ranks=[RankInfo(0, "h", 10, KILLED, 0), RankInfo(1, "h", 11, KILLED, None)])
    es._on_exit(0, 0)
    assert es.loop.callbacks == []
    es.launcher.ranks[1].returncode = 0
    es._on_exit(1, 0)
    [notify] = es.loop.callbacks
    notify()
    assert es.state == "after" and es.stop_data == {"exit_code": 0, "ranks": {0: 0, 1: 0}, "stopped": [0, 1]}


# ---------------------------------------------------------------- the stop button outside cells


@pytest.fixture(scope="module")
def cluster(descendants):
    before = descendants()
    c = Cluster(n=2).start(timeout=30)
    yield c
    c.stop()
    assert not _alive(descendants() - before), _alive(descendants() - before)


def _hold_rank(c: Cluster, rank: int, gate) -> object:
    """Keep ``rank`` busy with an earlier request until ``gate`` exists (20 s at most)."""
    return c.client[rank].execute(
        "import os, time\nt_end = time.monotonic() + 20\n"
        f"while not os.path.exists({str(gate)!r}) and time.monotonic() < t_end:\n    time.sleep(0.01)",
        silent=False, block=False)  # not silent: the rank's agent sees it as a running cell


def _interrupt_when(pred, timeout: float = 20) -> threading.Thread:
    """SIGINT to this (main) thread once ``pred()`` holds: the stop button of a plain-Python session.
    Never fired otherwise (the test then fails on its own): a SIGINT landing later, in another test,
    would stop the whole pytest run. Join the thread before the test ends."""
    main = threading.main_thread().ident

    def fire():
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        signal.pthread_kill(main, signal.SIGINT)

    t = threading.Thread(target=fire, daemon=True)
    t.start()
    return t


def _main_thread_waiting() -> bool:
    """The main thread is inside Supervisor.wait (where the stop button is handled)."""
    import sys

    from mlx_jupyter.cluster.supervision import Supervisor

    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None:
        if frame.f_code is Supervisor.wait.__code__:
            return True
        frame = frame.f_back
    return False


def _busy(c: Cluster, rank: int) -> bool:
    return any(row["rank"] == rank and row.get("busy") for row in c.status(0.5))


def test_interrupted_setup_stops_on_every_rank(cluster, tmp_path):
    """Rank 1 is held, so rank 0's setup blocks forming `group`: the stop button ends
    rank 0's setup and rank 1's queued one never runs; the next setup works."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("needs the main thread (signals)")
    gate = tmp_path / "gate"
    held = _hold_rank(cluster, 1, gate)
    firing = _interrupt_when(lambda: _main_thread_waiting() and _busy(cluster, 0))
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt, match="setup of mx/world/group interrupted; stopped on the ranks"):
        cluster.setup(timeout=30)
    firing.join(5)
    assert time.monotonic() - t0 < 20
    # the rank's agent says idle once the aborted request's reply is out (a moment on a loaded machine)
    assert _wait_for(lambda: not _busy(cluster, 0), 5), "rank 0 still runs the interrupted setup"
    gate.touch()
    held.get(10)
    # rank 1's queued setup is answered "aborted" at once (run, it would block 30 s forming `group`)
    assert _wait_for(lambda: not cluster.client.outstanding, 5), cluster.client.outstanding
    assert cluster.needs_reform and not cluster.ready_ns
    info = cluster.setup(timeout=30)
    assert [i["group"] for i in info.values()] == [[0, 2], [1, 2]], info


def test_interrupted_push_is_not_applied_later(cluster, tmp_path):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("needs the main thread (signals)")
    gate = tmp_path / "gate"
    held = _hold_rank(cluster, 1, gate)
    assert _wait_for(lambda: _busy(cluster, 1))
    firing = _interrupt_when(_main_thread_waiting)
    with pytest.raises(KeyboardInterrupt, match="push interrupted"):
        cluster.push({"late": 1}, timeout=30)
    firing.join(5)
    gate.touch()
    held.get(10)
    assert _wait_for(lambda: not cluster.client.outstanding, 5), cluster.client.outstanding
    cluster.check_ranks([0, 1])  # neither rank is left busy
    cluster.client[:].execute("seen = 'late' in globals()", block=True)
    assert cluster.pull("seen", targets=[1]) == [False]


def _wait_for(pred, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_breakpoint_from_plain_python_goes_on_with_one_line_and_debug_runs_commands(cluster, capsys):
    run = cluster.run("x = 5\nif group.rank() == 1:\n    breakpoint()\ny = x + group.rank()\nprint('y', y)")
    run.display(timeout=20)  # nothing can prompt here (no terminal): one line, then the cell goes on
    out = capsys.readouterr().out
    assert "rank 1: pdb cannot prompt here" in out and "[rank 1] y 6" in out, out
    with pytest.raises(Exception, match="rank 1 raised ValueError"):
        cluster.run("def f(v):\n    w = v + 1\n    raise ValueError(w)\nif group.rank() == 1:\n    f(2)").display(timeout=20)
    cluster.debug(commands="p w; p v").display(timeout=20)  # the first rank that raised: 1
    out = capsys.readouterr().out
    assert "[rank 1] (Pdb rank 1) p w" in out and "[rank 1] 3" in out and "[rank 1] 2" in out, out
