"""A real ``jupyter server`` with our extension, in a subprocess, for the security tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from mlx_jupyter.vocab.ports import free_port_block

HERE = Path(__file__).resolve().parent


class JupyterServer:
    """``jupyter server`` on 127.0.0.1 serving ``root``, token-authenticated, in ``env`` (default: this process's);
    ``request`` calls its API. As a context manager: ready on entry, stopped on exit."""

    def __init__(self, root: Path, runtime: Path, args: Sequence[str] = (), env: Optional[Mapping[str, str]] = None):
        self.root, self.port, self.token = root, free_port_block(1, 1), "t0ken-" + os.urandom(4).hex()
        env = {**(os.environ if env is None else env),
               "JUPYTER_RUNTIME_DIR": str(runtime / "rt"), "JUPYTER_CONFIG_DIR": str(runtime / "cfg"),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")]))}
        self.log = open(runtime / "server.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", f"--port={self.port}", "--ip=127.0.0.1", "--no-browser",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}", "--allow-root",
             "--ServerApp.jpserver_extensions={'mlx_jupyter.server': True}", *args],
            env=env, stdout=subprocess.DEVNULL, stderr=self.log, cwd=str(runtime))

    def __enter__(self) -> "JupyterServer":
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait_ready(self, timeout: float = 60) -> "JupyterServer":
        """Until the server answers (a readiness probe), or fail with its log."""
        deadline = time.monotonic() + timeout
        pause = threading.Event()
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_text()
            try:
                if self.request("GET", "/api/status", timeout=2)[0] == 200:
                    return self
            except OSError:
                pass
            pause.wait(0.2)   # its socket is not up yet
        raise AssertionError(f"jupyter server did not answer within {timeout} s:\n{self.log_text()}")

    def request(self, method: str, path: str, body: Optional[bytes] = None, timeout: float = 10) -> tuple[int, Any]:
        """(status, decoded JSON or text) of one API call."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=body, method=method,
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, text = r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            status, text = exc.code, exc.read().decode()
        try:
            return status, json.loads(text) if text else None
        except ValueError:
            return status, text

    def post_json(self, path: str, data: Any, timeout: float = 10) -> tuple[int, Any]:
        return self.request("POST", path, json.dumps(data).encode(), timeout)

    def log_text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-4000:]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.log.close()
