"""A cluster's ranks on other hosts (a Slurm job's nodes), as the panel lists them from the owner's file: their
health is the owner's record (the server cannot look at a pid there), and the owner rewrites it when a rank dies."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from mlx_jupyter.cluster import Cluster, registry

pytestmark = pytest.mark.timeout(90)


def _write(cluster_id: str, **fields) -> None:
    registry.folder().mkdir(parents=True, exist_ok=True)
    ranks = [{"rank": 0, "host": "node1", "pid": 4242}, {"rank": 1, "host": "node2", "pid": 4243}]
    (registry.folder() / f"{cluster_id}.json").write_text(json.dumps(
        {"id": cluster_id, "owner_pid": os.getpid(), "ranks": ranks, **fields}))


def test_ranks_on_other_hosts_have_the_owners_word(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    _write("mlx-alive", busy=[1], dead=[])
    _write("mlx-onedead", busy=[], dead=[1])
    _write("mlx-older", busy=[])   # an owner that writes no "dead": nothing known here
    listed = {c["id"]: [(r["health"], r.get("health_from")) for r in c["ranks"]] for c in registry.published()}
    assert listed == {"mlx-alive": [("idle", "owner"), ("running", "owner")],
                      "mlx-onedead": [("idle", "owner"), ("exited", "owner")],
                      "mlx-older": [("remote", "owner"), ("remote", "owner")]}


def test_the_owner_rewrites_its_file_when_a_rank_dies(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    with Cluster(n=2, timeout=60) as cluster:
        entry = registry.entry(cluster.cluster_id)
        assert entry["dead"] == [] and entry["hosts"] == ["127.0.0.1"] and entry["slurm"] is None
        pid = {r["rank"]: r["pid"] for r in entry["ranks"]}[1]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while (registry.entry(cluster.cluster_id) or {}).get("dead") != [1] and time.monotonic() < deadline:
            time.sleep(0.05)   # polling the file the owner rewrites from its rank-exit callback
        assert registry.entry(cluster.cluster_id)["dead"] == [1]
