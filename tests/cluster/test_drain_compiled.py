"""Issue 42 with a compiled training step, as MLX's own distributed example writes it (``mx.compile`` around
``nn.average_gradients``): its collectives never pass through the record's wrappers after the trace, so the
record counts them from the trace (:mod:`mlx_jupyter.where.mlx_compiled`). A rank's error, or the stop
button, in such a loop keeps MLX's `world`."""

from __future__ import annotations

import random

import pytest

from mlx_jupyter.cluster import Cluster
from mlx_jupyter.cluster.cells.display import DistributedCellError, show_run
from test_drain import _assert_released_in_time, _stop_in_the_loop, _sum_is_right

pytestmark = pytest.mark.timeout(240)

#: MLX's distributed training example: the step compiled with the model's and optimizer's state
COMPILED_STEP = """
import mlx.nn as nn, mlx.optimizers as optim
from functools import partial
mx.random.seed(0)
model = nn.Linear(16, 8)
opt = optim.SGD(learning_rate=0.01)
state = [model.state, opt.state]
X, Y = mx.random.normal((16, 16)) + world.rank(), mx.random.normal((16, 8))
loss_and_grad = nn.value_and_grad(model, lambda m, x, y: nn.losses.mse_loss(m(x), y))

@partial(mx.compile, inputs=state, outputs=state)
def step(x, y):
    loss, grads = loss_and_grad(model, x, y)
    opt.update(model, nn.average_gradients(grads, group=world))
    return loss
"""

#: rank 1 raises before its 41st step, while rank 0 waits in that step's compiled all_sum
RAISES_MID_LOOP = """
for i in range(60):
    if world.rank() == 1 and i == 40:
        1/0
    mx.eval(step(X, Y), state)
after = True
"""

LOOP = """
while True:
    mx.eval(step(X, Y), state)
"""


@pytest.fixture(scope="module")
def cluster():
    with Cluster(n=2) as c:
        show_run(c.run(COMPILED_STEP), timeout=60)
        yield c


def test_a_rank_that_raises_before_a_compiled_step_has_it_drained_and_keeps_world(cluster):
    for _ in range(2):   # the second time, every step runs the traced graph
        with pytest.raises(DistributedCellError, match="rank 1 raised ZeroDivisionError"):
            show_run(cluster.run(RAISES_MID_LOOP), timeout=30)
        cluster.drainer.thread.join(10)
        assert cluster.drainer.last == "drained: rank 1 made all_sum #41 on `world`", cluster.drainer.last
        assert all(not row.get("world_closed") for row in cluster.status()), cluster.status()
        show_run(cluster.run("went_on = 'after' in globals()"), timeout=30)
        assert cluster.pull("went_on") == [False, False]
        _sum_is_right(cluster, 2)


def test_stop_during_a_compiled_training_loop_keeps_world_every_time(cluster):
    rng = random.Random(11)
    took = []
    for i in range(12):
        took.append(_stop_in_the_loop(cluster, LOOP, 2, rng))
        assert all(not row.get("world_closed") for row in cluster.status()), (i, cluster.status(),
                                                                             cluster.drainer.last)
        _sum_is_right(cluster, 2)
    _assert_released_in_time(took, cluster)
