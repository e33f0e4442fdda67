"""``%%mlx_distributed --profile`` in a real kernel: a timeline per rank (SVG) and a summary naming
the late rank under the cell, and the records from Python afterwards (Cluster.profile())."""

from __future__ import annotations

import ast

import xml.etree.ElementTree as ET

import pytest

from tests.cluster.kernel import Kernel
from tests.cluster.test_magics import start_cluster, stop_leaves_nothing

pytestmark = pytest.mark.timeout(150)


@pytest.fixture(scope="module")
def k():
    """One kernel with a cluster of 2 for the module's cells; at the end, stopping it leaves nothing."""
    kernel = Kernel()
    try:
        kernel_pid = kernel.pid
        start_cluster(kernel)
        yield kernel
        stop_leaves_nothing(kernel, kernel_pid)
    finally:
        kernel.close()

CELL = """%%mlx_distributed --profile
import time
import numpy as np
from mlx_jupyter import distributed as dist
for i in range(3):
    if group.rank() == 1:
        time.sleep(0.2)  # rank 1 is late to every op
    dist.all_sum(np.ones(16, np.float32), group=group)
"""


def test_profile_shows_the_timeline_and_names_the_straggler(k):
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


MLX_PROFILED = """%%mlx_distributed --profile
import mlx.nn as nn
x = mx.ones(1024)
for i in range(20):
    mx.eval(mx.distributed.all_sum(x, group=world))
avg = nn.average_gradients({"w": mx.ones((64,)), "b": mx.ones((8,))})
print("mean", avg["w"][0].item())
"""

HISTORY = ("from mlx_jupyter import magics\nfrom mlx_jupyter.server.history import ClusterHistory\n"
           "c = magics.current()\nh = ClusterHistory(min_gap=0.0)\nh.add(1000.0, c.where_samples(timeout=10))")


def loop(n: int) -> str:
    return f"%%mlx_distributed\nx = mx.ones(1024)\nfor i in range({n}):\n    mx.eval(mx.distributed.all_sum(x, group=world))"


def test_mlxs_own_collectives_are_counted_across_cells_and_profiled(k):
    """Issue 45 §1: MLX's own all_sums on `world` give the dashboard's history their calls and bytes per second,
    counted on from one cell to the next (the second cell makes more calls than the first: totals that restarted
    would read 500 - 300); --profile records each one per rank (nn.average_gradients' too) with its bytes."""
    assert k.run("%%mlx_distributed\npass", 60).status == "ok"   # MLX's world and its record on the ranks
    assert k.run(HISTORY, 30).status == "ok"
    for n, t in ((300, 1001.0), (500, 1003.0)):
        assert k.run(loop(n), 60).status == "ok"
        assert k.run(f"h.add({t}, c.where_samples(timeout=10))", 30).status == "ok"
    got = k.run("s = h.series()['ranks']\nprint([(s[r]['mlx_ops'], s[r]['mlx_bytes'], s[r]['ops']) for r in '01'])", 30)
    assert got.status == "ok", got
    rates = ([None, 300.0, 250.0], [None, 300 * 4096, 250 * 4096], [None, 0.0, 0.0])
    assert str([rates, rates]).replace("[[", "[(").replace("]], [[", "]), ([").replace("]]]", "])]") in got.stdout, got

    res = k.run(MLX_PROFILED, 60)
    assert res.status == "ok", res
    assert "mean 1.0" in res.stdout and "42 of MLX's own mx.distributed" in res.stdout, res.stdout
    assert "no collectives ran" not in res.stdout and any("image/svg+xml" in d.get("data", {}) for d in res.displays)
    after = k.run("from mlx_jupyter import magics\np = magics.current().profile()\n"
                  "mine = {k: [r for r in p[k] if r.library == 'mlx'] for k in sorted(p)}\n"
                  "print(sorted(p), [len(v) for v in mine.values()])\n"
                  "print({(r.op, r.group_id, r.nbytes, r.dtype, r.shape, r.timed) for v in mine.values() for r in v})\n"
                  "print([v[-1].at for v in mine.values()])", 30)
    assert after.status == "ok", after
    assert "[0, 1] [21, 21]" in after.stdout, after.stdout
    # a set prints in its process's hash order (each process its own seed): compare the values
    assert ast.literal_eval(after.stdout.splitlines()[1]) == {("all_sum", "mx:world", 4096, "float32", (1024,), True),
                                                              ("all_sum", "mx:world", 288, "float32", (72,), True)}, \
        after.stdout
    assert after.stdout.count("line 6 via mlx.nn.utils.average_gradients") == 2, after.stdout
    none = k.run("%%mlx_distributed --profile\ny = 1", 30)
    assert none.status == "ok" and "no collectives ran in this cell" in none.stdout, none


P2P_PROFILED = """%%mlx_distributed --profile
x = mx.arange(256, dtype=mx.float32)
for i in range(3):
    if world.rank() == 0:
        mx.eval(mx.distributed.send(x, 1, group=world))
    else:
        y = mx.distributed.recv_like(x, 0, group=world)
        mx.eval(y)
z = mx.distributed.recv((4,), mx.int32, 1, group=world) if world.rank() == 0 else None
if world.rank() == 1:
    mx.eval(mx.distributed.send(mx.ones(4, dtype=mx.int32), 0, group=world))
else:
    mx.eval(z)
print("sum", float(y.sum()) if world.rank() == 1 else int(z.sum().item()))
"""


def test_mlxs_send_and_recv_are_in_the_profile(k):
    """Issue 45 §1 for point-to-point ops: MLX's send, recv and recv_like are in --profile's timeline and records, each
    on its rank with its peer, bytes, dtype and shape (recv_like recorded as recv)."""
    res = k.run(P2P_PROFILED, 60)
    assert res.status == "ok", res
    assert "sum 32640.0" in res.stdout and "sum 4" in res.stdout, res.stdout
    assert "8 op records on 2 ranks" in res.stdout and "8 of MLX's own mx.distributed" in res.stdout, res.stdout
    assert "MLX send #" in res.stdout or "MLX recv #" in res.stdout, res.stdout
    svgs = [d["data"]["image/svg+xml"] for d in res.displays if "image/svg+xml" in d.get("data", {})]
    titles = " ".join(t.text or "" for t in ET.fromstring(svgs[0]).iter("{http://www.w3.org/2000/svg}title"))
    # a bar is one op (its words) or a burst of ops close in time ("4 ops (recv, send)")
    assert len(svgs) == 1 and "send" in titles and "recv" in titles, titles
    after = k.run("from mlx_jupyter import magics\np = magics.current().profile()\n"
                  "print(sorted((r.rank, r.op, r.seq, r.waited_on, r.group_id, r.nbytes, r.dtype, r.shape, r.timed)"
                  " for k in p for r in p[k] if r.library == 'mlx'))", 30)
    assert after.status == "ok", after
    got = ast.literal_eval(after.stdout.strip())
    want = sorted([(0, "send", s, 1, "mx:world", 1024, "float32", (256,), True) for s in (1, 2, 3)]
                  + [(1, "recv", s, 0, "mx:world", 1024, "float32", (256,), True) for s in (1, 2, 3)]
                  + [(0, "recv", 1, 1, "mx:world", 16, "int32", (4,), True),
                     (1, "send", 1, 0, "mx:world", 16, "int32", (4,), True)])
    assert got == want, after.stdout
