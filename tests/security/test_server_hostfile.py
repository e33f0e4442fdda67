"""The panel's server reads a hostfile as every entry point does (issues 31 §4, 35 §1), through a real
``jupyter server``: fields MLX ignores start a cluster, hostile files are 400s naming the field,
overlapping reads are not taken for hanging ones, and no copy outlives the server."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time

import pytest

from server_process import JupyterServer

pytestmark = pytest.mark.timeout(180)
CLUSTERS = "/mlx-jupyter/clusters"


def start_server(base) -> JupyterServer:
    """A server whose temp folder is its own (TMPDIR), so that what it leaves there can be seen."""
    root, runtime, tmp = base / "root", base / "runtime", base / "tmp"
    for d in (root, runtime, tmp):
        d.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TMPDIR", str(tmp))
        s = JupyterServer(root, runtime)
    s.tmp = tmp
    return s.wait_ready()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = start_server(tmp_path_factory.mktemp("shared"))
    yield s
    s.stop()


@pytest.fixture
def own_server(tmp_path):
    s = start_server(tmp_path)
    yield s
    if s.proc.poll() is None:
        s.stop()


def wait_state(server, cluster_id: str, states: set[str], timeout: float = 90) -> dict:
    deadline, pause = time.monotonic() + timeout, threading.Event()
    while True:
        found = [c for c in server.request("GET", CLUSTERS)[1]["clusters"] if c["id"] == cluster_id]
        if found and found[0]["state"] in states:
            return found[0]
        assert time.monotonic() < deadline, found
        pause.wait(0.3)   # a poll of the listing, as the panel does


def test_fields_mlx_ignores_start_a_cluster(server):
    (server.root / "h.json").write_text(json.dumps({"note": "rack 3", "backend": "ring", "hosts": [
        {"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "comment": "the left one"}]}))
    status, reply = server.post_json(CLUSTERS, {"hostfile": "h.json", "n": 2})
    assert status == 202, reply
    listed = wait_state(server, reply["id"], {"running", "failed"})
    assert listed["state"] == "running" and listed["hostfile"] == "h.json" and len(listed["ranks"]) == 2, listed
    assert len(list(server.tmp.glob("mlx-jupyter-server-*/*"))) == 1   # the checked copy the cluster reads
    assert server.request("DELETE", f"{CLUSTERS}/{reply['id']}", timeout=60)[0] == 200
    assert list(server.tmp.glob("mlx-jupyter-server-*/*")) == []


def test_a_server_stopped_during_a_start_leaves_no_copy(own_server):
    """Issue 31 §4 (jupyter_server never calls a module extension's unload hook: the copy stayed)."""
    (own_server.root / "h.json").write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]))
    status, reply = own_server.post_json(CLUSTERS, {"hostfile": "h.json", "n": 2})
    assert status == 202, reply
    assert list(own_server.tmp.glob("mlx-jupyter-server-*/*"))
    own_server.stop()
    assert list(own_server.tmp.glob("mlx-jupyter-server-*")) == []


def test_a_hostfile_stopped_during_its_start_leaves_no_copy(server):
    (server.root / "h.json").write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]))
    status, reply = server.post_json(CLUSTERS, {"hostfile": "h.json", "n": 2})
    assert status == 202, reply
    assert server.request("DELETE", f"{CLUSTERS}/{reply['id']}", timeout=90)[0] == 200
    assert list(server.tmp.glob("mlx-jupyter-server-*/*")) == []


@pytest.mark.parametrize("content, message", [
    ("[" * 100000, "'bad.json': not a hostfile (nested deeper than 32 levels)"),
    (json.dumps({"hots": []}), "'bad.json' is not a valid hostfile: its top level is wrong"),
])
def test_a_hostile_hostfile_is_a_400_naming_the_field(server, content, message):
    (server.root / "bad.json").write_text(content)
    status, reply = server.post_json(CLUSTERS, {"hostfile": "bad.json"})
    assert status == 400 and reply["field"] == "hostfile" and message in reply["error"], reply
    assert list(server.tmp.glob("mlx-jupyter-server-*/*")) == []


def test_a_refused_start_leaves_no_copy(server):
    """65 ranks in all is refused after the hostfile was read and copied: the copy goes."""
    (server.root / "h.json").write_text(json.dumps([{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}] * 5))
    status, reply = server.post_json(CLUSTERS, {"hostfile": "h.json", "n": 13})
    assert status == 400 and reply["field"] == "hostfile" and "at most 64" in reply["error"], reply
    assert list(server.tmp.glob("mlx-jupyter-server-*/*")) == []


def test_overlapping_reads_are_not_taken_for_hanging_ones(server):
    """Issue 31 §4: the 4th of overlapping reads got "earlier hostfile reads are still hanging"."""
    for i in range(8):
        (server.root / f"h{i}.json").write_text(json.dumps([{"ssh": "127.0.0.1", "ip": []}]))   # refused: a typo
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda i: server.post_json(CLUSTERS, {"hostfile": f"h{i}.json"}, 30), range(8)))
    assert all(code == 400 and "is not a valid hostfile: host entry 0" in r["error"] for code, r in replies), replies
