"""The controller's log at a cluster start: no ERROR for the engines' IOPub welcome (JEP 65)."""

from __future__ import annotations

import glob
import os

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
