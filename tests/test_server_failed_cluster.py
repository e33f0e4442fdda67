"""A cluster the panel could not start (mpi as root): listed as failed with its error, no connect code,
and Dismiss (DELETE) removes it. A real jupyter server; the failure is Open MPI's own root refusal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from mlx_jupyter.net.ports import free_port_block

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root (mpi's refusal)")]


def _call(base: str, token: str, path: str, method: str = "GET", body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method, headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.fixture()
def server(tmp_path):
    port, token = free_port_block(1, 1), "t0ken"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_ALLOW_RUN_AS_ROOT")}
    env.update(JUPYTER_RUNTIME_DIR=str(tmp_path / "rt"), JUPYTER_CONFIG_DIR=str(tmp_path / "cfg"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1", "--no-browser",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}", "--allow-root",
         "--ServerApp.jpserver_extensions={'mlx_jupyter.server': True}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    base = f"http://127.0.0.1:{port}/mlx-jupyter/"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "jupyter_server exited"
            try:
                _call(base, token, "backends")
                break
            except OSError:
                assert time.monotonic() < deadline, "jupyter_server did not answer within 60 s"
                time.sleep(0.2)  # the server's socket is not up yet (a readiness probe)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_a_failed_start_is_listed_failed_gives_no_connect_code_and_is_dismissed(server):
    base, token = server
    status, reply = _call(base, token, "clusters", "POST", {"n": 2, "backend": "mpi"})
    assert status == 202, reply
    cid = reply["id"]
    deadline = time.monotonic() + 60
    while True:  # the start runs on the server's worker; poll its state (bounded)
        status, item = _call(base, token, f"clusters/{cid}")
        assert status == 200, item
        if item["state"] != "starting":
            break
        assert time.monotonic() < deadline, item
        time.sleep(0.2)
    assert item["state"] == "failed", item
    assert "mpirun refuses to run as root" in item["error"] and "panel's hostfile field" in item["error"], item
    status, reply = _call(base, token, f"clusters/{cid}/connect")
    assert status == 409 and "did not start" in reply["error"] and "code" not in reply, reply
    status, reply = _call(base, token, f"clusters/{cid}", "DELETE")
    assert (status, reply) == (200, {"id": cid, "state": "removed"})
    status, listing = _call(base, token, "clusters")
    assert cid not in [c["id"] for c in listing["clusters"]], listing
