"""The first hour's papercuts (issue 30 §4), each in a real kernel with real ranks."""

from __future__ import annotations

import re

import pytest

from tests.cluster.kernel import Kernel, cluster_kernel

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def kernel():
    yield from cluster_kernel(2, 90, stop=True)


def test_a_rank_traceback_names_the_notebook_cell(kernel):
    """The notebook ran more cells than the ranks: their traceback still says the notebook's In[N]."""
    for _ in range(3):
        assert kernel.run("x = 1").status == "ok"
    count = kernel.run("print(get_ipython().execution_count)")
    cell_no = int(count.stdout.strip()) + 1
    res = kernel.run("%%mlx_distributed\ndef f():\n    raise ValueError('boom')\nf()", 60)
    assert res.status == "error", res
    tb = res.traceback
    assert f"Cell In[{cell_no}], line 4" in tb and f"Cell In[{cell_no}], line 3, in f" in tb, tb
    assert not re.search(rf"Cell In\[(?!{cell_no}\])\d+\]", tb), tb


def test_the_cause_comes_first_and_mlx_socket_noise_is_folded_below_it(kernel):
    """Rank 1 raises while rank 0 is inside MLX's all_sum on `world`: the error says so first; MLX's
    ring lines (its sockets closing as rank 0 is released) are at most one line per rank, after it."""
    res = kernel.run("%%mlx_distributed\nimport time\nif world.rank() == 1:\n    time.sleep(0.5)\n"
                     "    raise RuntimeError('the cause')\nmx.eval(mx.distributed.all_sum(mx.ones(1 << 20), group=world))",
                     60)
    assert res.status == "error", res
    assert "[ring]" not in res.stdout + res.stderr, res.stderr  # nothing of MLX's before the error
    tb = res.traceback
    first = tb.splitlines()[0]
    assert first.startswith("DistributedCellError: rank 1 raised RuntimeError: the cause"), tb
    ring = [line for line in tb.splitlines() if "[ring]" in line]
    assert len(ring) <= 1 and all(tb.index(line) > tb.index("RuntimeError: the cause\n") for line in ring), tb
    restart = kernel.run("%mlx_cluster restart", 90)  # a new `world` for the next tests
    assert restart.status == "ok", restart


def test_a_connected_notebooks_rank_traceback_names_its_own_cell(kernel):
    """A connected notebook's cells go through the controller: the ranks' tracebacks still say that
    notebook's In[N], not the rank's own count nor the owner's."""
    cid = kernel.run("from mlx_jupyter import magics; print(magics.current().cluster_id)").stdout.strip()
    other = Kernel()
    try:
        assert other.run(f"%load_ext mlx_jupyter\n%mlx_cluster connect {cid}", 60).status == "ok"
        for _ in range(4):
            assert other.run("y = 2").status == "ok"
        cell_no = int(other.run("print(get_ipython().execution_count)").stdout.strip()) + 1
        res = other.run("%%mlx_distributed\ndef g():\n    raise KeyError('nope')\ng()", 60)
        assert res.status == "error", res
        tb = res.traceback
        assert f"Cell In[{cell_no}], line 4" in tb and f"Cell In[{cell_no}], line 3, in g" in tb, tb
        assert not re.search(rf"Cell In\[(?!{cell_no}\])\d+\]", tb), tb
        assert other.run("%mlx_cluster stop", 30).status == "ok"   # a connected notebook only disconnects
    finally:
        other.close()
