"""The lab panel's REST API, attacked through a real ``jupyter server`` (issue 21, items 2-5).

jupyter_server's authorization applies (a read-only user lists clusters but cannot start or stop
one), hostfile paths stay under the server's root and their content is never echoed, a FIFO as a
hostfile does not freeze the server, and malformed bodies are 400s naming the field, never 500s.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import time

import pytest

from server_process import JupyterServer

pytestmark = pytest.mark.timeout(120)
CLUSTERS = "/mlx-jupyter/clusters"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server with the default authorizer (everything allowed to its token's user)."""
    root, runtime = tmp_path_factory.mktemp("root"), tmp_path_factory.mktemp("runtime")
    s = JupyterServer(root, runtime).wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def readonly(tmp_path_factory):
    """A server whose Authorizer allows only ``read``."""
    root, runtime = tmp_path_factory.mktemp("root-ro"), tmp_path_factory.mktemp("runtime-ro")
    s = JupyterServer(root, runtime, ["--ServerApp.authorizer_class=readonly_authorizer.ReadOnlyAuthorizer"])
    yield s.wait_ready()
    s.stop()


def test_a_read_only_user_lists_clusters_but_cannot_start_or_stop_one(readonly):
    assert readonly.post_json("/api/kernels", {})[0] == 403            # jupyter_server's own rule, for comparison
    status, reply = readonly.post_json(CLUSTERS, {"n": 1, "hosts": "127.0.0.1"})
    assert status == 403, reply                                        # was 202: a controller and engines started
    assert readonly.request("DELETE", f"{CLUSTERS}/mlx-0000")[0] == 403
    assert readonly.request("GET", CLUSTERS) == (200, {"clusters": []})   # reading is allowed, and nothing started
    assert readonly.request("GET", "/mlx-jupyter/backends")[0] == 200


@pytest.mark.parametrize("body, field", [
    (b"[]", "body"), (b'"x"', "body"), (b"{", "body"), (b"[" * 5000, "body"), (b'{"n": NaN}', "body"),
    (b'{"n": 1e400}', "n"), (b'{"n": 0}', "n"), (b'{"n": 65}', "n"), (b'{"n": "2"}', "n"), (b'{"n": true}', "n"),
    (json.dumps({"hosts": ["h"] * 500}).encode(), "hosts"),
    (json.dumps({"n": 2, "hosts": ",".join(f"h{i}" for i in range(40))}).encode(), "hosts"),
    (b'{"hosts": [1]}', "hosts"), (b'{"hosts": "a;reboot"}', "hosts"), (b'{"hosts": {"a": 1}}', "hosts"),
    (b'{"backend": "tcp"}', "backend"), (b'{"hostfile": 7}', "hostfile"), (b'{"hostfile": "a\\u0000b"}', "hostfile"),
    (b'{"nn": 2}', "nn"), (json.dumps({"hosts": "h", "hostfile": "f.json"}).encode(), "hostfile"),
])
def test_a_malformed_body_is_a_400_naming_the_field(server, body, field):
    status, reply = server.request("POST", CLUSTERS, body)
    assert status == 400, reply
    assert reply["field"] == field and reply["error"].startswith(f"{field}: "), reply


def test_nothing_started_from_the_malformed_bodies(server):
    assert server.request("GET", CLUSTERS) == (200, {"clusters": []})


def test_a_hostfile_outside_the_root_is_refused_without_echoing_it(server, tmp_path):
    secret = "sk-live=" + secrets.token_hex(8)   # not a host name: the parser refuses it, and used to quote it
    outside = tmp_path / "secret.json"
    outside.write_text(json.dumps([{"ssh": secret}]))
    up = os.path.relpath(outside, server.root)   # ../../.../secret.json
    link = server.root / "innocent.json"
    link.symlink_to(outside)
    bad = server.root / "bad.json"
    bad.write_text(json.dumps({"hosts": [{"ssh": "127.0.0.1"}, {"ssh": secret}]}))
    for name in (up, str(outside), "innocent.json", "~/../../" + up.lstrip("./")):
        status, reply = server.post_json(CLUSTERS, {"hostfile": name})
        assert status == 400 and reply["field"] == "hostfile", reply
        # a path that leaves the directory "is outside" it; a link inside it that points out "leads outside"
        how = "leads outside" if name == "innocent.json" else "is outside"
        assert f"{how} the directory this Jupyter server serves" in reply["error"], reply
        assert secret not in json.dumps(reply), reply
    status, reply = server.post_json(CLUSTERS, {"hostfile": "bad.json"})   # inside, malformed: named, not quoted
    assert status == 400 and secret not in json.dumps(reply), reply
    assert reply["error"] == ("hostfile: 'bad.json' is not a valid hostfile: host entry 1 (rank 1) is wrong "
                              "(see docs/hostfiles.md for the format; `mlx-jupyter config` writes one)"), reply


def test_a_fifo_as_hostfile_does_not_freeze_the_server(server):
    fifo = server.root / "hosts.json"
    os.mkfifo(fifo)
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            started = time.monotonic()
            post = pool.submit(server.post_json, CLUSTERS, {"hostfile": "hosts.json"}, 15)
            status = pool.submit(server.request, "GET", "/api/status", None, 15)
            contents = server.request("GET", "/api/contents", timeout=15)
            assert status.result(15)[0] == 200 and contents[0] == 200
            code, reply = post.result(15)
        assert time.monotonic() - started < 10       # nobody ever writes the FIFO: it was never waited on
        assert code == 400 and reply["field"] == "hostfile", reply
        assert reply["error"].startswith("hostfile: 'hosts.json' is not a regular file"), reply
    finally:
        fifo.unlink()
