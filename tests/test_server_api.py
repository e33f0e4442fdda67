"""The lab panel's API serves the one list of backends (issue 13): a real jupyter server, one GET."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from mlx_jupyter.hostfile import BACKENDS
from mlx_jupyter.net.ports import free_port_block

pytestmark = pytest.mark.timeout(90)


def test_backends_endpoint_lists_the_hostfile_modules_backends(tmp_path):
    port, token = free_port_block(1, 1), "t0ken"
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1", "--no-browser",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}", "--allow-root",
         "--ServerApp.jpserver_extensions={'mlx_jupyter.server': True}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/mlx-jupyter/backends"
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    try:
        deadline, reply = time.monotonic() + 60, None
        while reply is None and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            try:
                with urllib.request.urlopen(req, timeout=2) as r:
                    reply = json.loads(r.read())
            except OSError:
                time.sleep(0.2)  # the server's socket is not up yet (a readiness probe)
        assert reply == {"backends": list(BACKENDS)}
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
