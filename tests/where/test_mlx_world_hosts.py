"""MLX's world on 2 namespace hosts (real sshd, one rank per host): the late rank named from ``cluster.where()``.

Needs root (the test bed; else skipped)."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest

from mlx_jupyter.cluster import Cluster

pytestmark = pytest.mark.timeout(120)


def test_rank_0_waits_in_mlx_all_sum_on_the_other_host(testbed):
    bed = testbed
    flag = Path("/tmp") / f"mlxj-where-go-{uuid.uuid4().hex}"   # the hosts share this /tmp
    c = Cluster(n=1, hosts=bed.ips[:2], ssh_options=bed.ssh_options(), controller_ip=f"{bed.net}.1", timeout=30)
    try:
        c.start()
        c.setup(timeout=20)
        run = c.run(f"import os, time\na = mx.ones(5)\nif world.rank() == 1:\n"
                    f"    while not os.path.exists({str(flag)!r}): time.sleep(0.02)\n"
                    "y = mx.distributed.all_sum(a, group=world)\nprint(y)")
        want = re.compile(r"rank 0 waits in MLX all_sum #1 \(float32\[5\], built at line 5, evaluated at line 6\) on "
                          r"rank 1(?: for [0-9.]+ s)?; rank 1 has called 0 MLX collectives and is at line 4")
        deadline, diagnosis = time.monotonic() + 20, ""
        while time.monotonic() < deadline and not want.search(diagnosis):
            diagnosis = c.where().diagnosis
        assert want.search(diagnosis), diagnosis
        flag.touch()
        assert run.wait(20), "the ranks did not go on once rank 1 called the all_sum"
        assert not run.failed
    finally:
        flag.unlink(missing_ok=True)
        c.stop()
