"""The panel's Restart, through a real ``jupyter server``: ``POST clusters/<id>/restart`` is
execute-level (a read-only user gets 403), 404 for an unknown id, and on a cluster the server
started it keeps the ranks' names, also for a notebook connected to it, whose next cell runs on
the new ranks with a working MLX world. After the panel's Stop, the connected handle offers only
what works from there."""

from __future__ import annotations

import threading
import time

import pytest

from server_process import JupyterServer

pytestmark = pytest.mark.timeout(150)
CLUSTERS = "/mlx-jupyter/clusters"


def wait_for(condition, timeout: float, what: str) -> None:
    deadline, pause = time.monotonic() + timeout, threading.Event()
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        pause.wait(0.2)


@pytest.fixture()
def server(tmp_path_factory, monkeypatch):
    root, runtime = tmp_path_factory.mktemp("root"), tmp_path_factory.mktemp("runtime")
    s = JupyterServer(root, runtime).wait_ready()
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime / "rt"))   # where a notebook finds its clusters
    yield s
    s.stop()


def test_restart_is_execute_level_and_404_for_an_unknown_id(tmp_path_factory, server):
    assert server.request("POST", f"{CLUSTERS}/mlx-nope/restart") == (404, {"error": "no cluster mlx-nope"})
    root, runtime = tmp_path_factory.mktemp("root-ro"), tmp_path_factory.mktemp("runtime-ro")
    readonly = JupyterServer(root, runtime, ["--ServerApp.authorizer_class=readonly_authorizer.ReadOnlyAuthorizer"])
    try:
        assert readonly.wait_ready().request("POST", f"{CLUSTERS}/mlx-nope/restart")[0] == 403
    finally:
        readonly.stop()


def test_the_panels_restart_keeps_the_names_for_a_connected_notebook(server):
    from mlx_jupyter.cluster import Cluster, ClusterError
    from mlx_jupyter.cluster.cells.display import show_run

    status, reply = server.post_json(CLUSTERS, {"n": 2, "hosts": "127.0.0.1"})
    assert status == 202, reply
    cid = reply["id"]

    def state() -> str:
        return server.request("GET", f"{CLUSTERS}/{cid}")[1].get("state", "")

    wait_for(lambda: state() == "running", 60, "the panel's cluster runs")
    c = Cluster.connect(cid, timeout=30)
    try:
        show_run(c.run("import numpy as np\nv = np.arange(3) + world.rank()"), timeout=30)
        with pytest.raises(ClusterError, match="the Restart button of the MLX Cluster panel"):
            c.restart()   # the server owns it: the message offers what works from here
        status, reply = server.request("POST", f"{CLUSTERS}/{cid}/restart", timeout=90)
        assert status == 200 and reply["report"].startswith("restart: kept 2 names on 2 ranks"), reply
        wait_for(lambda: not c.namespaces.ready and not c.dead, 10, "the connected handle sees the new ranks")
        show_run(c.run("s = mx.distributed.all_sum(mx.ones(1), group=world).item()\nw = (v * 2).tolist()"),
                 timeout=30)
        assert c.pull("s") == [2.0, 2.0] and c.pull("w") == [[0, 2, 4], [2, 4, 6]]
        assert server.request("DELETE", f"{CLUSTERS}/{cid}")[0] == 200
        wait_for(lambda: len(c.dead) == 2, 10, "the connected handle sees the ranks gone")
        with pytest.raises(ClusterError, match=f"{cid} was stopped where it was started: cluster.stop"):
            c.restart()
    finally:
        c.stop()
