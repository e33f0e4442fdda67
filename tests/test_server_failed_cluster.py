"""A cluster the panel could not start (mpi as root): listed as failed with its error, no connect code,
and Dismiss (DELETE) removes it. A real jupyter server; the failure is Open MPI's own root refusal."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.security.server_process import JupyterServer

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root (mpi's refusal)")]


def _call(server: JupyterServer, path: str, method: str = "GET", body: dict | None = None) -> tuple[int, dict]:
    return server.request(method, "/mlx-jupyter/" + path, None if body is None else json.dumps(body).encode())


@pytest.fixture()
def server(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    with JupyterServer(tmp_path, tmp_path, env=env) as server:
        yield server


def test_a_failed_start_is_listed_failed_gives_no_connect_code_and_is_dismissed(server):
    status, reply = _call(server, "clusters", "POST", {"n": 2, "backend": "mpi"})
    assert status == 202, reply
    cid = reply["id"]
    deadline = time.monotonic() + 60
    while True:  # the start runs on the server's worker; poll its state (bounded)
        status, item = _call(server, f"clusters/{cid}")
        assert status == 200, item
        if item["state"] != "starting":
            break
        assert time.monotonic() < deadline, item
        time.sleep(0.2)
    assert item["state"] == "failed", item
    assert "mpirun refuses to run as root" in item["error"] and "panel's hostfile field" in item["error"], item
    status, reply = _call(server, f"clusters/{cid}/connect")
    assert status == 409 and "did not start" in reply["error"] and "code" not in reply, reply
    status, reply = _call(server, f"clusters/{cid}", "DELETE")
    assert (status, reply) == (200, {"id": cid, "state": "removed"})
    status, listing = _call(server, "clusters")
    assert cid not in [c["id"] for c in listing["clusters"]], listing
