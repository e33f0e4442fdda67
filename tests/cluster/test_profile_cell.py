"""``%%mlx_distributed --profile`` in a real kernel: a timeline per rank (SVG) and a summary naming
the late rank under the cell, and the records from Python afterwards (Cluster.profile())."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tests.cluster.kernel import Kernel
from tests.cluster.test_magics import start_cluster, stop_leaves_nothing

pytestmark = pytest.mark.timeout(150)

CELL = """%%mlx_distributed --profile
import time
import numpy as np
from mlx_jupyter import distributed as dist
for i in range(3):
    if group.rank() == 1:
        time.sleep(0.2)  # rank 1 is late to every op
    dist.all_sum(np.ones(16, np.float32), group=group)
"""


def test_profile_shows_the_timeline_and_names_the_straggler():
    k = Kernel()
    try:
        kernel_pid = k.pid
        start_cluster(k)
        res = k.run(CELL, 60)
        assert res.status == "ok", res
        svgs = [d["data"]["image/svg+xml"] for d in res.displays if "image/svg+xml" in d.get("data", {})]
        assert len(svgs) == 1, res
        root = ET.fromstring(svgs[0])
        titles = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}title"))
        assert "all_sum #3" in titles and "rank 1" in ET.tostring(root, encoding="unicode"), titles
        assert "straggler: rank 1" in res.stdout, res.stdout
        after = k.run("from mlx_jupyter import magics\np = magics.current().profile()\n"
                      "print(sorted(p), [[r.op for r in p[k] if r.op == 'all_sum'] for k in sorted(p)])", 30)
        assert after.status == "ok", after
        assert "[0, 1] [['all_sum', 'all_sum', 'all_sum'], ['all_sum', 'all_sum', 'all_sum']]" in after.stdout, after
        plain = k.run("%%mlx_distributed\nimport numpy as np\ndist.all_sum(np.ones(4), group=group)\nprint('ok')", 30)
        assert plain.status == "ok" and not any("image/svg+xml" in d.get("data", {}) for d in plain.displays), plain
        refused = k.run("%%mlx_distributed --profile --noblock\npass", 30)
        assert refused.status == "error" and "--noblock" in str(refused.error), refused
        stop_leaves_nothing(k, kernel_pid)
    finally:
        k.close()
