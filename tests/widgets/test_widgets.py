"""Widgets and the lab panel's server side, without a browser: models, actions, refresh policy, REST API."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest

pytest.importorskip("anywidget")

from mlx_jupyter.topology import Topology
from mlx_jupyter.topology.model import MacHost, Port
from mlx_jupyter.topology.system_profiler import Peer
from mlx_jupyter.widgets import ClusterStatusWidget, TopologyWidget
from mlx_jupyter.widgets.status import rows_from_status
from mlx_jupyter.widgets.topology_model import topology_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "thunderbolt"


# -- the topology model -------------------------------------------------------------------------


def test_mesh_model():
    m = topology_model(Topology.from_recordings(FIXTURES / "four-m3-ultra-mesh"))
    assert m["summary"] == "4 hosts · 6 cables · full mesh"
    assert m["backend"]["name"] == "jaccl" and m["backend"]["error"] is None
    assert m["missing"] == [] and len(m["plan"]) == 6
    assert all(c["kind"] == "direct" and c["generation"] == 5 and not c["one_sided"] for c in m["cables"])
    assert {h["rdma"] for h in m["hosts"]} == {"enabled"}
    json.dumps(m)  # JSON-able as is


def test_broken_mesh_model():
    m = topology_model(Topology.from_recordings(FIXTURES / "four-macs-broken-mesh"))
    assert m["missing"] == [[0, 1]]
    assert m["backend"]["name"] == "jaccl-ring"
    assert m["backend"]["ring"] and len(m["backend"]["ring"]) == 4
    refused = topology_model(Topology.from_recordings(FIXTURES / "four-macs-broken-mesh"), backend="jaccl")
    assert refused["backend"]["name"] is None and "Incomplete mesh" in refused["backend"]["error"]


def test_foreign_and_hub_and_speeds():
    foreign = topology_model(Topology.from_recordings(FIXTURES / "cable-to-foreign-mac"))
    [f] = [c for c in foreign["cables"] if c["b"] is None]
    assert f["kind"] == "foreign" and f["foreign"]["model"] and "x" in f and f["addresses"] is None
    hub = topology_model(Topology.from_recordings(FIXTURES / "peer-behind-hub"))
    assert hub["cables"][0]["kind"] == "hub" and hub["cables"][0]["via"]
    mixed = topology_model(Topology.from_recordings(FIXTURES / "tb4-and-tb5-mixed"))
    assert {c["generation"] for c in mixed["cables"]} == {4, 5}
    assert len({c["colour"] for c in mixed["cables"]}) == 2


def test_one_sided_cable_is_marked():
    a = MacHost("a", (Port("en2", "UA", link_gbps=80.0, peer=Peer("UB")),))
    b = MacHost("b", (Port("en2", "UB", link_gbps=80.0, peer=None),))  # b does not see the cable
    m = topology_model(Topology([a, b]))
    [c] = m["cables"]
    assert c["one_sided"] and c["seen_from"] == ["a"]
    assert any("seen only from a" in w for w in m["warnings"])


# -- the topology widget's actions --------------------------------------------------------------


def test_discover_apply_save(tmp_path):
    w = TopologyWidget.from_recordings(FIXTURES / "four-macs-broken-mesh", hostfile_path=str(tmp_path / "h.json"))
    statuses = []
    w.observe(lambda ch: statuses.append(dict(ch["new"])), "status")
    w.discover()
    progress = [s for s in statuses if s["action"] == "discover" and s["total"] == 4]
    assert [s["done"] for s in progress][-4:] == [1, 2, 3, 4]
    assert w.status["level"] == "success"
    result = w.apply_setup()
    assert all(r["mode"] == "auto" and r["ok"] for r in result.values())
    ran = [argv for _, argv in w.runner.calls if argv[:3] == ("sudo", "-n", "ifconfig")]  # never prompts
    assert len(ran) == 4 + 2 * 5  # bridge0 down on each host, an address per cable end
    path = w.save_hostfile()
    data = json.loads(path.read_text())
    assert data["backend"] == "jaccl-ring" and len(data["hosts"]) == 4
    from mlx_jupyter.hostfile import read_hostfile

    assert [h.ssh for h in read_hostfile(str(path)).hosts] == [h["ssh"] for h in data["hosts"]]


def test_manual_setup_without_sudo(tmp_path):
    src = FIXTURES / "four-macs-ring-only"
    topo = Topology.from_recordings(src)
    w = TopologyWidget(topo, runner=None)
    result = w.apply_setup(auto=False)
    assert all(r["mode"] == "manual" and r["commands"][0] == "sudo ifconfig bridge0 down" for r in result.values())


def test_unreachable_host_is_left_out():
    w = TopologyWidget.from_recordings(FIXTURES / "four-m3-ultra-mesh")
    w.discover(["m3-ultra-1", "m3-ultra-2", "no-such-mac"])
    assert w.topology.names == ["m3-ultra-1", "m3-ultra-2"]
    assert w.status["level"] == "error" and "no-such-mac" in w.status["message"]


def test_start_cluster_uses_factory(tmp_path):
    made = {}

    class FakeCluster:
        size = 4
        running = True

        def __init__(self, hostfile, backend):
            made.update(hostfile=hostfile, backend=backend)

        def start(self, progress=None, **kw):
            for i in range(5):
                progress(i, 4)

    w = TopologyWidget.from_recordings(FIXTURES / "four-m3-ultra-mesh", hostfile_path=str(tmp_path / "h.json"),
                                       cluster_factory=FakeCluster)
    cluster = w.start_cluster()
    assert isinstance(cluster, FakeCluster) and made["backend"] == "jaccl"
    assert json.loads(Path(made["hostfile"]).read_text())["backend"] == "jaccl"
    assert w.status["level"] == "success"
    from mlx_jupyter import magics

    try:
        assert magics.current() is cluster  # %%mlx_distributed uses it (no other cluster was running)
    finally:
        magics.set_current(None)


def test_start_cluster_keeps_a_running_current_cluster(tmp_path):
    from mlx_jupyter import magics

    class Running:
        running = True

    class FakeCluster:
        size = 1
        running = True

        def __init__(self, hostfile, backend):
            pass

        def start(self, progress=None, **kw):
            progress(1, 1)

    mine = Running()
    previous = magics.set_current(mine)
    try:
        w = TopologyWidget.from_recordings(FIXTURES / "four-m3-ultra-mesh", hostfile_path=str(tmp_path / "h.json"),
                                           cluster_factory=FakeCluster)
        w.start_cluster()
        assert magics.current() is mine
    finally:
        magics.set_current(previous)


def test_front_end_message_runs_action_in_thread(tmp_path):
    w = TopologyWidget.from_recordings(FIXTURES / "four-m3-ultra-mesh", hostfile_path=str(tmp_path / "h.json"))
    done = threading.Event()
    w.observe(lambda ch: ch["new"].get("action") == "save" and ch["new"]["level"] != "info" and done.set(), "status")
    w._on_front_end(w, {"action": "save"}, [])
    assert done.wait(10)
    assert (tmp_path / "h.json").exists()


def test_front_end_files_ship_beside_the_widgets():
    here = Path(__import__("mlx_jupyter.widgets", fromlist=["x"]).__file__).parent
    for name in ("topology.js", "topology.css", "status.js", "status.css"):
        assert (here / name).stat().st_size > 100
    assert "export default" in (here / "topology.js").read_text()


# -- the status widget --------------------------------------------------------------------------


class FakeCluster:
    """status() like Cluster's; counts calls; exit callbacks like Cluster's."""

    cluster_id = "mlx-fake"
    backend = "ring"
    hosts = ["127.0.0.1"]
    hostfile = None
    size = 2

    def __init__(self):
        self.running = True
        self.calls = 0
        self.states = ["idle", "idle"]
        self.rank_exit_callbacks = []
        self.called = threading.Event()

    def status(self, timeout=1.0):
        self.calls += 1
        self.called.set()
        return [{"rank": r, "host": "127.0.0.1", "pid": 100 + r, "state": s, "backend": "ring", "memory": 2**20 * 50}
                for r, s in enumerate(self.states)]


def test_rows_track_cell_start():
    since = {}
    rows = rows_from_status([{"rank": 0, "state": "busy"}, {"rank": 1, "state": "idle"}], since, 100.0)
    assert rows[0]["busy_since"] == 100.0 and rows[1]["busy_since"] is None
    rows = rows_from_status([{"rank": 0, "state": "busy"}, {"rank": 1, "state": "busy"}], since, 105.0)
    assert rows[0]["busy_since"] == 100.0 and rows[1]["busy_since"] == 105.0
    rows = rows_from_status([{"rank": 0, "state": "idle"}, {"rank": 1, "state": "busy"}], since, 106.0)
    assert rows[0]["busy_since"] is None


def test_rows_take_the_ranks_own_cell_start():
    """With the rank's `cell_started` the cell time is exact: for a widget first looking
    mid-cell, and for a new cell that began between two refreshes."""
    since = {}
    rows = rows_from_status([{"rank": 0, "state": "busy", "cell_started": 42.5},
                             {"rank": 1, "state": "busy", "cell_started": None}], since, 100.0)
    assert [r["busy_since"] for r in rows] == [42.5, 100.0]
    rows = rows_from_status([{"rank": 0, "state": "busy", "cell_started": 101.0}], since, 102.0)
    assert rows[0]["busy_since"] == 101.0  # the next cell, not the previous one's continuation
    rows = rows_from_status([{"rank": 0, "state": "idle", "cell_started": None}], since, 103.0)
    assert rows[0]["busy_since"] is None and 0 not in since


def test_status_sends_only_changes():
    c = FakeCluster()
    w = ClusterStatusWidget(c, autostart=False)
    sent = []
    w.observe(lambda ch: sent.append(ch["new"]), "rows")
    w.refresh()
    w.refresh()
    assert sent == []  # nothing changed since the first refresh (done in __init__)
    c.states = ["busy", "idle"]
    w.refresh()
    assert len(sent) == 1 and sent[0][0]["state"] == "busy"
    c.running = False
    w.refresh()
    assert w.rows == [] and "no cluster" in w.message


def test_status_thread_rate_and_wake():
    c = FakeCluster()
    w = ClusterStatusWidget(c, interval=0.01)  # clamped to 1 s
    try:
        assert w.interval == 1.0
        c.called.clear()
        before = c.calls
        for cb in c.rank_exit_callbacks:  # a rank died: refresh at once, not after the interval
            cb(1, -9)
        assert c.called.wait(0.9)
        assert c.calls == before + 1
    finally:
        w.close()
    assert w._thread is None and c.rank_exit_callbacks == []


# -- the server side of the lab panel -----------------------------------------------------------


def test_registry_roundtrip(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    from mlx_jupyter.cluster import registry

    c = FakeCluster()
    registry.publish(c)
    [item] = registry.published()
    assert item["id"] == "mlx-fake" and item["owner_pid"] == os.getpid()
    dead = dict(item, id="mlx-dead", owner_pid=2**22 + 12345)
    (registry.folder() / "mlx-dead.json").write_text(json.dumps(dead))
    assert [i["id"] for i in registry.published()] == ["mlx-fake"]
    assert not (registry.folder() / "mlx-dead.json").exists()
    registry.unpublish("mlx-fake")
    assert registry.published() == []
    with pytest.raises(ValueError):
        registry.unpublish("../etc")


def test_status_widget_does_not_publish(tmp_path, monkeypatch):
    """The cluster publishes itself; a widget refreshing after a stop must not list it again."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    from mlx_jupyter.cluster import registry

    w = ClusterStatusWidget(FakeCluster(), autostart=False)
    w.refresh()
    assert registry.published() == []


class _Sets:
    n = 2


def _unstarted_cluster(monkeypatch, tmp_path):
    """A real `Cluster` whose controller and ranks are faked: start/stop run their own code."""
    from mlx_jupyter.cluster import Cluster
    from mlx_jupyter.cluster import processes
    from mlx_jupyter.cluster.startup import StartupSequence

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    c = Cluster(n=2, cell_channel=False)

    class Client:
        ids = [0, 1]
        _closed = False

        def close(self, linger=0):
            pass

    class Controller:
        pid = None

        def on_stop(self, callback):   # the lost-controller watch (Slurm) registers here
            pass

    class Ipp:
        controller = Controller()
        engines = {}

        def start_controller_sync(self):
            pass

        def connect_client_sync(self):
            return Client()

        def stop_cluster_sync(self):
            pass

    monkeypatch.setattr(processes.ipp, "Cluster", lambda **kw: Ipp())
    monkeypatch.setattr(processes.ClusterProcesses, "start_engines",
                        lambda self: (setattr(self.table, "size", 2), setattr(Client, "ids", [0, 1])))
    monkeypatch.setattr(processes, "rank_pids", lambda es: set())
    monkeypatch.setattr(StartupSequence, "probe_channels", lambda self, deadline: None)
    monkeypatch.setattr(processes.ClusterProcesses, "engine_set", None)
    return c


def test_cluster_publishes_itself(tmp_path, monkeypatch):
    from mlx_jupyter.cluster import registry

    c = _unstarted_cluster(monkeypatch, tmp_path)
    c.start(timeout=5)
    [item] = registry.published()
    assert item["id"] == c.cluster_id and item["owner"] == "kernel" and item["size"] == 2
    c.stop()
    assert registry.published() == []


def test_registry_failure_never_breaks_start_or_stop(tmp_path, monkeypatch, caplog):
    from mlx_jupyter.cluster import registry

    c = _unstarted_cluster(monkeypatch, tmp_path)

    def broken(*a, **kw):
        raise OSError("read-only runtime dir")

    monkeypatch.setattr(registry, "publish", broken)
    monkeypatch.setattr(registry, "unpublish", broken)
    with caplog.at_level("WARNING", logger="mlx_jupyter.cluster"):
        c.start(timeout=5)
        assert c.running
        c.stop()
    assert not c.running
    assert sum("read-only runtime dir" in r.getMessage() for r in caplog.records) == 2


def test_manager_start_list_stop(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    from mlx_jupyter.server.manager import ClusterManager, connect_code

    class Fake(FakeCluster):
        def __init__(self, **kw):
            super().__init__()
            self.running = False
            self.cluster_id = f"mlx-{id(self):x}"
            self.kw = kw

        def start(self, progress=None):
            progress(2, 2)
            self.running = True

        def stop(self):
            self.running = False

    async def go():
        m = ClusterManager(factory=Fake)
        entry = await m.create(n=2, hosts="127.0.0.1", backend="ring")
        await m.start(entry)
        [item] = await m.listing()
        assert item["state"] == "running" and item["owner"] == "server"
        assert [r["health"] for r in item["ranks"]] == ["ok", "ok"]
        assert await m.stop(entry.cluster.cluster_id)
        assert await m.listing() == []
        assert not await m.stop("mlx-none")
        m.shutdown()

    asyncio.run(go())
    assert connect_code("mlx-1") == "%load_ext mlx_jupyter\n%mlx_cluster connect mlx-1"


def test_a_panel_restart_that_restarted_nothing_leaves_the_cluster_running(tmp_path, monkeypatch):
    """A keep-state restart that failed while saving (no rank stopped) keeps the card running; one
    that failed after the old ranks were gone marks it failed (its message says: dismiss it)."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    from mlx_jupyter.cluster import ClusterError
    from mlx_jupyter.cluster.kept_state import RestartNotStarted
    from mlx_jupyter.server.manager import ClusterManager

    class Fake(FakeCluster):
        def __init__(self, **kw):
            super().__init__()
            self.cluster_id = f"mlx-{id(self):x}"
            self.fail: Exception = RestartNotStarted("saving failed; nothing was lost")

        def start(self, progress=None):
            self.running = True

        def stop(self):
            self.running = False

        def restart(self, quiet=False):
            raise self.fail

    async def go():
        m = ClusterManager(factory=Fake)
        entry = await m.create(n=2, hosts="127.0.0.1", backend="ring")
        await m.start(entry)
        with pytest.raises(RestartNotStarted):
            await m.restart(entry.cluster.cluster_id)
        assert m.state_of(entry.cluster.cluster_id) == "running"
        entry.cluster.fail = ClusterError("starting the new ranks failed")
        with pytest.raises(ClusterError):
            await m.restart(entry.cluster.cluster_id)
        assert m.state_of(entry.cluster.cluster_id) == "failed"
        m.shutdown()

    asyncio.run(go())


def test_manager_takes_a_hostfile_and_checks_it_first(tmp_path, monkeypatch):
    """The panel's hostfile field: the factory gets a private copy of the checked file and no backend
    (the file's is used); an unreadable one is a RequestError naming it (the panel shows it), before
    anything starts. Paths are under the manager's root (the server's)."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    from mlx_jupyter.server.manager import ClusterManager
    from mlx_jupyter.server.requests import RequestError

    made = []

    def factory(**kw):
        made.append(kw)
        return FakeCluster()

    text = '{"backend": "jaccl", "envs": ["MLX_METAL_FAST_SYNCH=1"], "hosts": [{"ssh": "127.0.0.1", "ips": []}]}'
    (tmp_path / "hosts.json").write_text(text)
    m = ClusterManager(factory=factory, root_dir=str(tmp_path))

    async def go():
        entry = await m.create(n=1, hostfile="hosts.json")
        assert Path(made[-1]["hostfile"]).read_text() == text and "backend" not in made[-1]
        assert entry.hostfile.name == "hosts.json" and made[-1]["hostfile"] != str(tmp_path / "hosts.json")
        await m.create(n=1, hostfile=str(tmp_path / "hosts.json"), backend="ring")   # absolute, inside the root
        assert made[-1]["backend"] == "ring"
        with pytest.raises(RequestError, match="hostfile: 'missing.json': cannot open it"):
            await m.create(n=1, hostfile="missing.json")

    asyncio.run(go())
    assert len(made) == 2
    m.shutdown()
    assert not Path(made[0]["hostfile"]).exists()   # the private copies go with the manager


# -- with real local clusters ---------------------------------------------------------------------


def _assert_nothing_left(left: set[int]) -> None:
    """None of ``left`` (pids that were not there before the test) outlives a short grace."""
    import psutil

    procs = []
    for pid in left:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _gone, alive = psutil.wait_procs(procs, timeout=10)
    assert not alive, f"processes left behind: {[p.pid for p in alive]}"


@pytest.mark.timeout(180)
def test_connect_code_connects_a_kernel_to_a_server_cluster(tmp_path, monkeypatch, descendants):
    """The panel's "insert code to connect", run in a real kernel against a cluster the server manager started."""
    import nbformat
    from nbclient import NotebookClient

    from mlx_jupyter.server.manager import ClusterManager, connect_code

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    before = descendants()
    manager = ClusterManager(start_timeout=90)

    async def start():
        entry = await manager.create(n=2, backend="ring")
        await manager.start(entry)
        return entry, await manager.listing()

    entry, listing = asyncio.run(start())
    pids = set()
    try:
        assert entry.state == "running", entry.error
        [item] = listing
        pids = {r["pid"] for r in item["ranks"]}
        assert [r["health"] for r in item["ranks"]] == ["ok", "ok"] and len(pids) == 2
        cells = [connect_code(item["id"]),
                 "%%mlx_distributed\nimport os\n"
                 "x = mx.distributed.all_sum(mx.array([world.rank() + 1.0]), group=world).item()\n"
                 "print('pid', os.getpid(), 'sum', x)"]
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
        NotebookClient(nb, timeout=60, kernel_name="python3",
                       resources={"metadata": {"path": str(tmp_path)}}).execute()
        said = "".join(o.get("text", "") for o in nb.cells[0].outputs)
        assert f"connected to {item['id']}: 2 ranks" in said, said
        ran = "".join(o.get("text", "") for o in nb.cells[1].outputs)
        for pid in pids:  # every rank ran the cell, in its own process, and MLX's all_sum agreed
            assert f"pid {pid} sum 3.0" in ran, ran
    finally:
        assert asyncio.run(manager.stop(entry.cluster.cluster_id))
        manager.shutdown()
    _assert_nothing_left((descendants() - before) | pids)


@pytest.mark.timeout(180)
def test_start_cluster_default_path_on_a_local_hostfile(tmp_path, monkeypatch, descendants):
    """start_cluster() with the real default factory: a 2-rank 127.0.0.1 hostfile, all_sum, stop, nothing left."""
    from mlx_jupyter import magics
    from mlx_jupyter.widgets import topology as topology_mod

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    assert TopologyWidget().cluster_factory is topology_mod._default_cluster
    w = TopologyWidget.from_recordings(FIXTURES / "four-m3-ultra-mesh", hostfile_path=str(tmp_path / "local.json"))
    # what the widget would save for two local ring ranks (recordings only give Mac addresses)
    local = {"backend": "ring", "hosts": [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 2}
    w.model = {**w.model, "backend": {**w.model["backend"], "name": "ring", "hostfile": local, "error": None}}
    before = descendants()
    previous = magics.set_current(None)
    cluster = None
    pids: set[int] = set()
    try:
        cluster = w.start_cluster(timeout=90)
        assert json.loads((tmp_path / "local.json").read_text()) == local
        assert cluster.size == 2 and cluster.backend == "ring" and magics.current() is cluster
        assert w.status["level"] == "success" and "2 ranks ready (ring)" in w.status["message"]
        pids = {r["pid"] for r in cluster.status()}
        assert len(pids) == 2 and pids <= descendants()
        cluster.setup(timeout=60)
        cluster.run("x = mx.distributed.all_sum(mx.ones(2) * (world.rank() + 1), group=world).tolist()").wait(60)
        assert cluster.pull("x") == [[3.0, 3.0], [3.0, 3.0]]
    finally:
        if cluster is not None:
            cluster.stop()
        magics.set_current(previous)
    assert not cluster.running
    _assert_nothing_left((descendants() - before) | pids)
