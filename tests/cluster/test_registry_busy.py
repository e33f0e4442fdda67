"""A kernel's cluster as the panel lists it: ranks "idle" between cells, "running" only during one."""

from __future__ import annotations

import time

import pytest

from mlx_jupyter.cluster import Cluster, registry

pytestmark = pytest.mark.timeout(90)


def _health(cluster_id: str) -> list[str]:
    [item] = [c for c in registry.published() if c["id"] == cluster_id]
    return [r["health"] for r in item["ranks"]]


def _until(cluster_id: str, want: list[str], timeout: float = 20) -> list[str]:
    deadline = time.monotonic() + timeout
    while (seen := _health(cluster_id)) != want and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the file the owner rewrites at a cell's start and end
    return seen


def test_ranks_are_idle_between_cells_and_running_during_one(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    flag = tmp_path / "release"
    with Cluster(n=2, timeout=60) as cluster:
        assert _health(cluster.cluster_id) == ["idle", "idle"]
        run = cluster.run("import os, time\n"
                          "deadline = time.monotonic() + 30\n"
                          f"while not os.path.exists({str(flag)!r}) and time.monotonic() < deadline:\n"
                          "    time.sleep(0.02)\n", targets=[1])
        try:
            assert _until(cluster.cluster_id, ["idle", "running"]) == ["idle", "running"]
        finally:
            flag.write_text("go")
        assert run.done.wait(30) and not run.failed
        assert _until(cluster.cluster_id, ["idle", "idle"]) == ["idle", "idle"]


def test_a_malformed_busy_field_cannot_break_the_listing(tmp_path, monkeypatch):
    import json
    import os

    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    registry.folder().mkdir(parents=True)
    me = {"host": "127.0.0.1", "pid": os.getpid()}
    for cid, busy in (("mlx-a", "0"), ("mlx-b", 7), ("mlx-c", [1])):
        (registry.folder() / f"{cid}.json").write_text(json.dumps(
            {"id": cid, "owner_pid": os.getpid(), "busy": busy, "ranks": [{"rank": 0, **me}, {"rank": 1, **me}]}))
    listed = {c["id"]: [r["health"] for r in c["ranks"]] for c in registry.published()}
    assert listed == {"mlx-a": ["idle", "idle"], "mlx-b": ["idle", "idle"], "mlx-c": ["idle", "running"]}
