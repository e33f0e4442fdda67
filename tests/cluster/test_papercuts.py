"""The first hour's papercuts (issue 30 §4), each in a real kernel with real ranks."""

from __future__ import annotations

import re

import pytest

from tests.cluster.kernel import Kernel

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def kernel():
    k = Kernel()
    try:
        res = k.run("%load_ext mlx_jupyter\n%mlx_cluster start -n 2", 90)
        assert res.status == "ok", res
        yield k
        k.run("%mlx_cluster stop", 30)
    finally:
        k.close()


def test_a_rank_traceback_names_the_notebook_cell(kernel):
    """The notebook ran more cells than the ranks: their traceback still says the notebook's In[N]."""
    for _ in range(3):
        assert kernel.run("x = 1").status == "ok"
    count = kernel.run("print(get_ipython().execution_count)")
    cell_no = int(count.stdout.strip()) + 1
    res = kernel.run("%%mlx_distributed\ndef f():\n    raise ValueError('boom')\nf()", 60)
    assert res.status == "error", res
    tb = res.traceback
    assert f"Cell In[{cell_no}], line 3" in tb and f"Cell In[{cell_no}], line 2, in f" in tb, tb
    assert not re.search(rf"Cell In\[(?!{cell_no}\])\d+\]", tb), tb
