"""Which of MLX's own collectives a failing peer's rank can be released from, measured.

For each MLX operation: rank 1 raises, rank 0 is blocked in the operation. The
run must end within 2 s of the error with rank 0 "released" and the cause named.
MLX's world is closed by the release, so each case starts from restarted ranks.
The results table in docs/troubleshooting.md is this test's.
"""

from __future__ import annotations

import time

import psutil
import pytest

from mlx_jupyter.cluster import Cluster
from mlx_jupyter.cluster.cells.display import DistributedCellError, show_run

pytestmark = pytest.mark.timeout(120)

CASES = {
    "all_sum": "mx.eval(mx.distributed.all_sum(mx.ones(3)))",
    "all_max": "mx.eval(mx.distributed.all_max(mx.ones(3)))",
    "all_min": "mx.eval(mx.distributed.all_min(mx.ones(3)))",
    "all_gather": "mx.eval(mx.distributed.all_gather(mx.ones(3)))",
    "recv from the failed rank": "mx.eval(mx.distributed.recv_like(mx.ones(3), src=1))",
    "all_sum, 64 MiB": "mx.eval(mx.distributed.all_sum(mx.ones(16 << 20)))",
}


@pytest.fixture(scope="module")
def cluster(descendants):
    before = descendants()
    c = Cluster(n=2).start(timeout=30)
    yield c
    c.stop()
    left = [p for p in descendants() - before if psutil.pid_exists(p)]
    assert not left, f"processes left behind: {left}"


@pytest.mark.parametrize("op", list(CASES))
def test_blocked_mlx_operation_is_released_when_the_peer_raises(cluster, op):
    if cluster.setup_info and any(r.get("world_closed") for r in cluster.status()):
        cluster.restart(timeout=30)
    cluster.setup(timeout=30)
    # both ranks pass a barrier; then rank 1 raises while rank 0 goes straight into the operation
    code = f"group.barrier()\nif world.rank() == 1:\n    import time; t_err = time.monotonic(); 1/0\n{CASES[op]}"
    with pytest.raises(DistributedCellError) as err:
        show_run(cluster.run(code), timeout=20)
    [t_err] = cluster.pull("t_err", targets=[1])
    elapsed = time.monotonic() - t_err  # from the error to the end of the cell, its message shown
    outcomes = {o.rank: o for o in err.value.outcomes}
    assert outcomes[1].ename == "ZeroDivisionError"
    assert outcomes[0].status == "released" and "rank 1 raised ZeroDivisionError" in outcomes[0].note, outcomes[0]
    assert elapsed <= 2.0, f"released {elapsed:.2f} s after the error"
    print(f"\n{op}: released in {elapsed:.2f} s")
