"""The controller's log: no ERROR for the engines' IOPub welcome (JEP 65) at a start, and nothing of it
(heartbeats, requests) in a Jupyter server's log; its heart monitor beats quickly only while ranks are
admitted, so that a loaded machine logs no late or missed beats."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from mlx_jupyter.cluster import Cluster, registry
from mlx_jupyter.cluster.ipcontroller import is_iopub_welcome

pytestmark = pytest.mark.timeout(90)


def test_welcome_frames_are_recognised_and_other_traffic_is_not():
    welcome = [b"sig", b'{"msg_id": "x", "msg_type": "iopub_welcome", "version": "5.4"}', b"{}", b"{}", b"{}"]
    stream = [b"", b"sig", b'{"msg_id": "y", "msg_type": "stream", "version": "5.4"}', b"{}", b"{}",
              b'{"text": "msg_type: iopub_welcome"}']
    assert is_iopub_welcome(welcome) and not is_iopub_welcome(stream)


def test_a_cluster_start_logs_no_controller_error(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    with Cluster(n=2, timeout=60, log_level=10) as cluster:
        assert cluster.pull("__name__") == ["__main__", "__main__"]
        logs = glob.glob(os.path.join(registry.profile_dir(), "log", "ipcontroller-*.log"))
        text = "".join(open(f).read() for f in logs)  # read while running: stop removes the file
    assert "registration" in text, logs  # the controller's own log was found and read
    assert "without topic" not in text and "ERROR" not in text, text[-3000:]


@pytest.fixture()
def cpu_load():
    """Two busy processes for the test's length: the machine under load, as in a training session."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for p in busy:
        p.kill()
        p.wait(5)


def _admission_ms(log_text: str) -> list[int]:
    """How long each engine's registration took, from the controller's own lines."""
    return [int(ms) for ms in re.findall(r"finished registering engine \d+:\S+ in (\d+)ms", log_text)]


def test_a_server_cluster_used_under_load_logs_no_heartbeat_lines(tmp_path, monkeypatch, cpu_load):
    """The panel's cluster (a real jupyter server), cells and a restart under CPU load: the server's
    log gets none of the controller's lines (no heartbeats), the controller's own log no late or
    missed beat, and ranks are still admitted at the quick pace after a restart."""
    from mlx_jupyter.cluster.cells.display import show_run
    from tests.security.server_process import JupyterServer

    root, runtime = tmp_path / "root", tmp_path / "runtime"
    root.mkdir(), runtime.mkdir()
    server = JupyterServer(root, runtime).wait_ready()
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime / "rt"))   # where the server's clusters are listed
    try:
        status, reply = server.post_json("/mlx-jupyter/clusters", {"n": 2, "hosts": "127.0.0.1"})
        assert status == 202, reply
        cid = reply["id"]
        deadline, pause = time.monotonic() + 60, threading.Event()
        while server.request("GET", f"/mlx-jupyter/clusters/{cid}")[1].get("state") != "running":
            assert time.monotonic() < deadline, server.log_text()
            pause.wait(0.2)   # the server starts it in the background
        c = Cluster.connect(cid, timeout=30)
        for _ in range(5):
            show_run(c.run("x = sum(range(2_000_000))"), timeout=60)
        status, reply = server.request("POST", f"/mlx-jupyter/clusters/{cid}/restart", timeout=90)
        assert status == 200, reply
        for _ in range(3):
            show_run(c.run("x = sum(range(2_000_000))"), timeout=60)
        logs = glob.glob(os.path.join(registry.profile_dir(), "log", f"ipcontroller-{cid}-*.log"))
        controller = "".join(open(f).read() for f in logs)   # read while running: stop removes it
        c.stop()
        assert server.request("DELETE", f"/mlx-jupyter/clusters/{cid}")[0] == 200
    finally:
        server.stop()
    text = (runtime / "server.log").read_text()
    assert "heart" not in text.lower() and "[MLXController]" not in text and "[IPController]" not in text, text
    assert "Heartmonitor beating every 2000ms" in controller, controller[-3000:]
    for noise in ("missed a beat", "heartbeat::missed", "bad heartbeat", "hearts stopped"):
        assert noise not in controller, controller[-3000:]
    took = _admission_ms(controller)
    assert len(took) == 4, controller[-3000:]   # 2 ranks at the start, 2 after the restart
    assert max(took[2:]) < 1500, took   # the restart's ranks too were admitted at the quick pace


def test_hearts_that_stop_after_their_engine_left_are_handled_without_a_warning():
    """The heart monitor's news that a restart's old hearts stopped is dropped quietly (the hub
    would only warn); a heart the hub did not expect to stop is left to the hub (its unregistration),
    and the message stays readable by the hub (signatures are checked once)."""
    from collections import deque
    from types import SimpleNamespace

    from jupyter_client.session import Session

    from mlx_jupyter.cluster.ipcontroller import expected_stops

    session = Session(key=b"k")
    hub = SimpleNamespace(session=session, expect_stopped_hearts=deque([b"old-1", b"old-2"]))

    def news(kind: str, hearts: list[str]) -> list:
        return [b"heartmonitor"] + session.serialize(session.msg(kind, content={"hearts": hearts}),
                                                     ident=[b"heartmonitor", b""])[1:]

    assert expected_stops(hub, news("stopped_heart", ["old-1", "old-2"]))
    unexpected = news("stopped_heart", ["old-1", "live-3"])
    assert not expected_stops(hub, unexpected)   # one the hub must hear of
    assert session.deserialize(session.feed_identities(unexpected[1:])[1])["content"]["hearts"] == ["old-1", "live-3"]
    assert not expected_stops(hub, news("new_heart", ["old-1"]))
    assert not expected_stops(hub, [b"iopub", b"x"])
