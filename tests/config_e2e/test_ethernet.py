"""`mlx-jupyter config --over ethernet` on the bed's Linux hosts, then real ranks through `mlx-jupyter launch`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e_helpers import PY, mlx_jupyter, wait_until

pytestmark = pytest.mark.timeout(120)

ALL_SUM = ("import mlx.core as mx; g = mx.distributed.init(backend='ring', strict=True); "
           "x = mx.distributed.all_sum(mx.arange(4) + g.rank()); print('sum', g.rank(), g.size(), x.tolist())")


def rank_tmp(net: str) -> set[Path]:
    """The launcher's rank temp dirs for jobs on subnet ``net`` (the hosts share this machine's /tmp)."""
    found = set()
    for d in Path("/tmp").glob("mlx-jupyter.*"):
        try:
            if any(net + "." in f.read_text() for f in d.iterdir()):
                found.add(d)
        except OSError:  # removed meanwhile
            continue
    return found


def test_ethernet_hostfile_starts_real_ranks(testbed, tmp_path):
    names = [f"node-{i}" for i in range(1, testbed.n + 1)]
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", {n: i for i, n in enumerate(names, 1)})
    hostfile = tmp_path / "hostfile.json"
    res = mlx_jupyter(["config", "--hosts", ",".join(names), "--over", "ethernet", "--ssh-config", str(cfg),
                       "--output-hostfile", str(hostfile)])
    assert res.returncode == 0, res.stderr
    # each host's address on the network the hosts share (eth0, from `ip -j`), not loopback
    assert json.loads(hostfile.read_text()) == {
        "backend": "", "envs": [], "hosts": [{"ssh": n, "ips": [ip], "rdma": []} for n, ip in zip(names, testbed.ips)]}

    before = rank_tmp(testbed.net)
    res = mlx_jupyter(["launch", "--ssh-config", str(cfg), "--hostfile", str(hostfile), "--output", "raw",
                       PY, "-c", ALL_SUM], timeout=90)
    assert res.returncode == 0, res.stderr
    sums = sorted(line for line in res.stdout.splitlines() if line.startswith("sum "))
    assert sums == [f"sum {r} 4 [6, 10, 14, 18]" for r in range(4)], res.stdout + res.stderr
    assert wait_until(lambda: rank_tmp(testbed.net) <= before, 5), rank_tmp(testbed.net) - before


def test_ethernet_backend_and_env_are_saved(testbed, tmp_path):
    cfg = testbed.write_ssh_config(tmp_path / "ssh_config", {"node-1": 1, "node-2": 2})
    res = mlx_jupyter(["config", "--hosts", "node-1,node-2", "--over", "ethernet", "--backend", "ring",
                       "--env", "MLX_METAL_FAST_SYNCH=1", "--ssh-config", str(cfg)])
    assert res.returncode == 0, res.stderr
    printed = json.loads(res.stdout.split("========\n", 1)[1])
    assert printed == {"backend": "ring", "envs": ["MLX_METAL_FAST_SYNCH=1"], "hosts": [
        {"ssh": "node-1", "ips": [testbed.ips[0]], "rdma": []}, {"ssh": "node-2", "ips": [testbed.ips[1]], "rdma": []}]}
