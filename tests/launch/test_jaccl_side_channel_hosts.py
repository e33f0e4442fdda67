"""JACCL's bootstrap over our core's ring across hosts (the namespace test bed): what a jaccl launch plans
reaches every rank, the ranks form our signed ring from it, and each gather gives what JACCL exchanges."""

from __future__ import annotations

import json

import pytest

from launch_helpers import PY, collector
from needs import require_core
from mlx_jupyter.hostfile import Host
from mlx_jupyter.launch import Launcher

pytestmark = pytest.mark.timeout(180)

RANK_CODE = """
import json, os, struct
import mlx.core as mx
from mlx_jupyter import distributed as dist
from mlx_jupyter.vocab import rank_env

env = rank_env.current()
factory = dist.all_gather_factory(timeout=60)
rank, size = int(os.environ["MLX_RANK"]), len(json.load(open(os.environ["MLX_IBV_DEVICES"])))
gather = factory(rank, size)                                        # as MLX's init calls it
lengths = struct.unpack(f"<{size}i", gather(struct.pack("<i", rank + 1), 4))
width = max(lengths)
row = gather(bytes([48 + rank] * (rank + 1)).ljust(width, b"\\0"), width)
infos = [row[r * width:r * width + lengths[r]].decode() for r in range(size)]
mx.distributed.init(backend="jaccl", all_gather_factory=factory)    # MLX takes it (Linux: its jaccl stub)
print(json.dumps({"infos": infos, "hostfile_var": env.hostfile_var, "launchers": list(env.launchers),
                  "coordinator": env.jaccl.coordinator, "token": bool(env.token)}))
"""


@pytest.mark.parametrize("coordinator", [True, False])
def test_jaccl_bootstraps_over_our_ring_across_hosts(testbed, coordinator: bool, monkeypatch) -> None:
    require_core()
    monkeypatch.setenv("MLX_JUPYTER_CHECK_BACKEND", "0")   # Linux hosts cannot run JACCL: its bootstrap is what is tested
    n = len(testbed.ips)
    hosts = [Host(ip, [ip], [None if j == i else f"rdma_en{j}" for j in range(n)]) for i, ip in enumerate(testbed.ips)]
    out, on_output = collector()
    launcher = Launcher([PY, "-c", RANK_CODE], hosts=hosts, backend="jaccl", starting_port=4300,
                        ssh_options=testbed.ssh_options(), on_output=on_output, jaccl_coordinator=coordinator)
    launcher.start()
    assert launcher.wait(120) == 0, out
    results = {r: json.loads(line) for r, s, line in out if s == "stdout" and line.startswith("{")}
    assert sorted(results) == list(range(n)), out
    for res in results.values():
        assert res["infos"] == [str(r) * (r + 1) for r in range(n)]
        assert res["hostfile_var"] == "MLX_JUPYTER_HOSTFILE" and res["launchers"] == ["jaccl"] and res["token"]
        assert bool(res["coordinator"]) == coordinator    # a cluster's launch opens no coordinator port
