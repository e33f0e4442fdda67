"""Issue 42: Stop pressed while every rank is inside one long MLX evaluation they all joined (a long prompt's
prefill on a sharded model): MLX cannot cancel it, so the ranks finish it and then stop; MLX's `world` is
kept, the cell says so, and a second Stop shuts `world` down at once instead."""

from __future__ import annotations

import time

import pytest

from mlx_jupyter.cluster import Cluster
from mlx_jupyter.cluster.cells.display import show_run
from mlx_jupyter.cluster.cells.run import finishing_words
from mlx_jupyter.cluster.drain import BUSY_MOST, BUSY_WAIT
from mlx_jupyter.cluster.rank.drain import HOLD_MOST

pytestmark = pytest.mark.timeout(180)

#: how long the evaluation is made to last: past the wait for ranks of which one has left (BUSY_WAIT)
LASTS = BUSY_WAIT + 3.0

#: one layer of a sharded model: a matmul on each rank's shard, then an all_sum on `world`
LAYERS = """
import mlx.core as mx, time
world = mx.distributed.init()
w = mx.random.normal((512, 512), key=mx.random.key(world.rank())) / 23
def layers(k):
    x = mx.ones((256, 512))
    for _ in range(k):
        x = mx.distributed.all_sum(x @ w, group=world) / 2
    return x
t0 = time.monotonic(); mx.eval(layers(40)); per_layer = (time.monotonic() - t0) / 40
"""

#: one evaluation of about LASTS s, every layer's all_sum in it (a long prefill); ``after`` never runs
LONG = """
k = {k}
y = layers(k)
mx.eval(y)
after = True
"""


def _long_run(c: Cluster):
    """Start :data:`LONG` and return the run once every rank has built all its calls (it evaluates now)."""
    k = max(40, int(LASTS / max(c.pull("per_layer"))))
    r = c.run(LONG.format(k=k))
    deadline = time.monotonic() + 60
    while True:
        counts = [((s.get("mlx") or {}).get("counts") or {}).get("world", 0) for s in c.where_samples().values()]
        if len(counts) == 2 and min(counts) >= k:
            return r
        assert time.monotonic() < deadline and not r.done.is_set(), counts


def _notices(r, until: float) -> list[str]:
    """The run's notices (its own lines while it ends), read until it ended or ``until``."""
    said = []
    while not (r.done.is_set() and r.events.empty()) and time.monotonic() < until:
        ev = r.next_event(0.05)
        if ev is not None and ev.kind == "notice":
            said.append(ev.payload)
        r.check_deadlines()
    return said


@pytest.fixture(scope="module")
def cluster():
    with Cluster(n=2) as c:
        c.execute(LAYERS, timeout=60)
        yield c


def test_the_ranks_finish_the_evaluation_then_stop_and_world_is_kept(cluster):
    r = _long_run(cluster)
    began = time.monotonic()
    r.interrupt()
    said = _notices(r, began + BUSY_MOST)
    took = time.monotonic() - began
    assert said == [finishing_words([0, 1])], said   # told once, while they finish
    assert all(o.status == "released" for o in r.outcomes.values()), \
        ({k: (o.status, o.note[:200]) for k, o in r.outcomes.items()}, cluster.drainer.last)
    assert took > BUSY_WAIT, (took, cluster.drainer.last)   # waited past the bound for ranks of which one left
    assert all(not row.get("world_closed") for row in cluster.status()), cluster.status()
    show_run(cluster.run("went_on = 'after' in globals()\nz = mx.distributed.all_sum(mx.ones(2)).tolist()"),
             timeout=30)
    assert cluster.pull("went_on") == [False, False] and cluster.pull("z") == [[2.0, 2.0]] * 2


def test_a_second_stop_shuts_world_down_at_once_naming_why(cluster):
    r = _long_run(cluster)
    r.interrupt()
    deadline = time.monotonic() + 30
    while not _notices(r, time.monotonic() + 0.05):   # the first stop's word: they finish the evaluation
        assert time.monotonic() < deadline and not r.done.is_set()
    again = time.monotonic()
    r.interrupt()
    assert r.wait(BUSY_WAIT), cluster.drainer.last
    assert time.monotonic() - again < BUSY_WAIT
    closed = [row.get("world_closed") for row in cluster.status()]
    assert all("stopped again while ranks 0, 1 finished an MLX evaluation every rank joined" in w
               for w in closed), closed


def test_a_rank_is_held_past_the_notebooks_longest_wait():
    assert HOLD_MOST > BUSY_MOST > BUSY_WAIT
