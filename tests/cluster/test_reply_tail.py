"""After a distributed cell the kernel replies without ipykernel's flush round trips and sleep,
for that request only, and every output of the cell is still there before the cell ends
(a real kernel with 2 local ranks, as a notebook runs it)."""

from __future__ import annotations

import pytest

from tests.cluster.kernel import Kernel, cluster_kernel

pytestmark = pytest.mark.timeout(120)

#: records, after each cell, the sleep the kernel is about to take before its reply
WATCH = """
_k = get_ipython().kernel
_tail_seen = []
get_ipython().events.register("post_run_cell", lambda result: _tail_seen.append(_k._execute_sleep))
"""


@pytest.fixture(scope="module")
def k():
    yield from cluster_kernel(2, 90, stop=True)


def seen_after(k: Kernel, code: str, status: str = "ok") -> float:
    """Run ``code``; the kernel's ``_execute_sleep`` as the cell ended (before the reply)."""
    res = k.run(code, 60)
    assert res.status == status, res
    res = k.run("print(_tail_seen[-1])", 30)
    assert res.status == "ok", res
    return float(res.stdout)


def test_only_a_distributed_cells_own_reply_skips_the_sleep(k):
    assert k.run(WATCH, 30).status == "ok"
    assert seen_after(k, "y = 2") == 0.0005  # ipykernel's own, on a plain cell
    assert seen_after(k, "%%mlx_distributed\nx = 1") == 0.0
    assert seen_after(k, "y = 3") == 0.0005  # back for the next cell
    assert seen_after(k, "%%mlx_distributed\nraise ValueError('boom')", status="error") == 0.0
    assert seen_after(k, "y = 4") == 0.0005


def test_a_sleep_the_user_set_is_kept(k):
    assert k.run(WATCH, 30).status == "ok"
    assert k.run("get_ipython().kernel._execute_sleep = 0.002", 30).status == "ok"
    try:
        assert seen_after(k, "%%mlx_distributed\nx = 1") == 0.0
        assert seen_after(k, "y = 5") == 0.002
    finally:
        k.run("get_ipython().kernel._execute_sleep = 0.0005", 30)


def test_every_line_the_ranks_print_arrives_before_the_cell_ends(k):
    """The kernel's trailing flush is skipped: the magic's own flush must have sent it all."""
    for _ in range(3):
        res = k.run("%%mlx_distributed --output rank\nimport sys\n"
                    "for i in range(3000):\n    print(f'line {i} of rank {world.rank()}')\n"
                    "print('last words', file=sys.stderr)", 60)
        assert res.status == "ok", res
        for rank in (0, 1):
            assert f"line 2999 of rank {rank}" in res.stdout
            assert sum(f" of rank {rank}\n" in line + "\n" for line in res.stdout.splitlines()) == 3000
        assert res.stderr.count("last words") == 2, res.stderr


def test_a_kernel_line_printed_after_the_magic_is_not_lost(k):
    """Text a post_run_cell hook prints after the magic returned: the armed flush still sends it."""
    assert k.run("get_ipython().events.register('post_run_cell', _say := lambda result: print('after the cell'))",
                 30).status == "ok"
    try:
        res = k.run("%%mlx_distributed\nx = 2", 60)
        assert res.status == "ok", res
        assert "after the cell" in res.stdout
    finally:
        k.run("get_ipython().events.unregister('post_run_cell', _say)", 30)
