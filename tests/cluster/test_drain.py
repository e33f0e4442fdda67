"""Issue 42: MLX's `world` outlives a rank's error and the stop button (a drain), on real ranks.

A rank that raised, or was stopped in Python, while its peers wait in an MLX collective on `world`
makes the calls they wait in with zeros; the peers' ops complete, they stop before their code sees
the drained result, and the next cell's collective on the same `world` gives the right sum, with no
restart. Where no drain is possible, MLX's world is shut down as before, with the reason in one line.
"""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from mlx_jupyter.cluster import Cluster
from mlx_jupyter.cluster.cells.display import DistributedCellError, show_run
from mlx_jupyter.where import drain_plan

pytestmark = pytest.mark.timeout(300)

#: the promise of the issue: a stopped rank's peers are released within this long
RELEASE_WITHIN = 1.0


# ---------------------------------------------------------------- the plan, alone


def _state(executing: bool, frozen: bool, made: dict, calls: list, unrun: dict | None = None) -> dict:
    return {"executing": executing, "frozen": frozen, "made": dict(made), "unrun": unrun or {},
            "calls": calls, "groups": {"world": [0, 2]}, "this_run": True}


def test_the_plan_has_the_rank_behind_make_the_call_its_blocked_peer_waits_in():
    call = ["world", 3, "all_gather", "float32", [4]]
    states = {0: _state(True, True, {"world": 3}, [call]), 1: _state(False, False, {"world": 2}, [])}
    plan = drain_plan.plan(states, [0, 1])
    assert plan.calls == {1: [("world", 3, "all_gather", "float32", (4,))]} and not plan.why
    assert drain_plan.describe(plan.calls) == "rank 1 made all_gather #3 on `world`"


def test_the_plan_follows_what_each_rank_ran_not_what_it_built():
    """A lazy graph: rank 0 built all_sum #1 and all_gather #2 but evaluates only #2 (it waits there); rank 1
    built #1 and never evaluated it. Rank 1 makes #2 alone: #1 ran nowhere."""
    built = [["world", 1, "all_sum", "float32", [4]], ["world", 2, "all_gather", "float32", [4]]]
    states = {0: _state(True, True, {"world": 2}, built, {"world": [1]}),
              1: _state(False, False, {"world": 1}, built[:1], {"world": [1]})}
    assert drain_plan.plan(states, [0, 1]).calls == {1: [("world", 2, "all_gather", "float32", (4,))]}
    ahead = {0: _state(True, True, {"world": 2}, built, {"world": [1]}),
             1: _state(False, False, {"world": 1}, built[:1])}   # rank 1 ran #1, which rank 0 never did
    assert "is blocked in another collective" in drain_plan.plan(ahead, [0, 1]).why
    three = built + [["world", 3, "all_sum", "float32", [8]]]
    states = {0: _state(True, True, {"world": 3}, three), 1: _state(False, False, {"world": 0}, [])}
    assert [c[1] for c in drain_plan.plan(states, [0, 1]).calls[1]] == [1, 2, 3]   # the order they were made


def test_a_rank_seen_in_the_next_collective_while_its_peer_finishes_the_last_is_asked_again():
    """Ring: rank 1 left all_sum #1 first and already waits in #2 when asked, while rank 0, asked a moment
    before, still finishes #1. Not a mismatch (a 4-rank Stop in average_gradients was shut down for it): ask
    again; once rank 0 has finished #1 and stopped, it makes #2."""
    calls = [["world", 1, "all_sum", "float32", [8]], ["world", 2, "all_sum", "float32", [8]]]
    moving = {0: _state(True, True, {"world": 1}, calls[:1]), 1: _state(True, True, {"world": 2}, calls)}
    plan = drain_plan.plan(moving, [0, 1])
    assert plan.wait and "rank 0 is blocked in another collective" in plan.why and not plan.calls
    settled = {0: _state(False, False, {"world": 1}, calls[:1]), 1: _state(True, True, {"world": 2}, calls)}
    assert drain_plan.plan(settled, [0, 1]).calls == {0: [("world", 2, "all_sum", "float32", (8,))]}


def test_the_plan_waits_for_a_rank_still_in_python_and_names_what_it_cannot_drain():
    waiting = {0: _state(True, True, {"world": 1}, [["world", 1, "all_sum", "float32", [2]]]),
               1: _state(True, False, {"world": 0}, [])}
    assert drain_plan.plan(waiting, [0, 1]).wait
    differ = {0: _state(True, True, {"world": 1}, [["world", 1, "all_sum", "float32", [2]]]),
              1: _state(True, True, {"world": 1}, [["world", 1, "all_sum", "float32", [3]]]),
              2: _state(False, False, {"world": 0}, [])}
    assert "differs across ranks" in drain_plan.plan(differ, [0, 1, 2]).why
    p2p = {0: _state(True, True, {"world": 0, "world:1>0": 1}, [["world:1>0", 1, "recv", "float32", [3]]]),
           1: {**_state(False, False, {"world": 0}, []), "groups": {"world": [1, 2]}}}
    p2p_ops = ("all_sum", "send", "recv")
    assert drain_plan.plan(p2p, [0, 1], ops=p2p_ops).calls == {1: [("world:1>0", 1, "send", "float32", (3,))]}
    assert "`send` cannot be drained" in drain_plan.plan(p2p, [0, 1], ops=("all_sum",)).why
    assert drain_plan.plan(waiting, [0, 1], dead={1: -9}).why.startswith("rank 1 died")
    slow = {0: _state(True, True, {"world": 1}, [["world", 1, "all_sum", "float32", [2]]]),
            1: _state(False, False, {"world": 1}, [["world", 1, "all_sum", "float32", [2]]])}
    plan = drain_plan.plan(slow, [0, 1])   # nobody behind: it may finish by itself; if not, this is why
    assert plan.wait and "no rank is behind" in plan.why and not plan.calls
    assert "cannot be drained" in drain_plan.plan(
        {0: _state(True, True, {"world": 1}, [["world", 1, "all_max", "float32", [2]]]),
         1: _state(False, False, {"world": 0}, [])}, [0, 1], ops=("all_sum",)).why


def test_a_call_left_in_flight_on_a_stream_after_the_cell_ended_is_drained_in_the_order_it_was_made():
    """mlx-lm's pipeline: rank 1's cell ended, but its stream (``async_eval``) sent #4 and waits in all_gather #4;
    rank 0 stopped after #3. Rank 0 makes the recv, then the all_gather, as rank 1's record orders them."""
    sent = [["world:1>0", 4, "send", "float32", [1, 1, 8]], ["world", 4, "all_gather", "float32", [1, 1, 8]]]
    got = [["world:1>0", 3, "recv", "float32", [1, 1, 8]], ["world", 3, "all_gather", "float32", [1, 1, 8]]]
    states = {0: _state(False, False, {"world": 3, "world:1>0": 3}, got),
              1: {**_state(False, False, {"world": 4, "world:1>0": 4}, sent), "groups": {"world": [1, 2]},
                  "inflight": {"world": [4]}}}
    plan = drain_plan.plan(states, [0, 1], ops=("all_gather", "send", "recv"))
    assert plan.calls == {0: [("world:1>0", 4, "recv", "float32", (1, 1, 8)),
                              ("world", 4, "all_gather", "float32", (1, 1, 8))]}, plan
    assert plan.frozen == [1]
    nothing = {r: {**st, "inflight": {}} for r, st in states.items()}   # every stream idle: nobody waits
    assert drain_plan.plan(nothing, [0, 1]) == drain_plan.Plan()


def test_a_second_round_counts_the_calls_the_first_made():
    """The drain calls MLX's own functions, unrecorded: the next round counts them, so it plans only what is new."""
    states = {0: _state(True, True, {"world": 2}, [["world", 1, "all_sum", "float32", [2]],
                                                  ["world", 2, "all_sum", "float32", [2]]]),
              1: _state(False, False, {"world": 0}, [])}
    first = drain_plan.plan(states, [0, 1])
    assert first.calls == {1: [("world", 1, "all_sum", "float32", (2,)), ("world", 2, "all_sum", "float32", (2,))]}
    again = drain_plan.with_drained(states, first.calls)
    assert drain_plan.plan(again, [0, 1]).busy and not drain_plan.plan(again, [0, 1]).calls
    later = {0: _state(True, True, {"world": 3}, [*states[0]["calls"], ["world", 3, "all_sum", "float32", [2]]]),
             1: states[1]}   # rank 0, released, now waits in #3, which its evaluation held
    assert drain_plan.plan(drain_plan.with_drained(later, first.calls), [0, 1]).calls == {
        1: [("world", 3, "all_sum", "float32", (2,))]}


def test_ranks_that_joined_every_call_are_busy_and_a_number_that_differs_is_named_at_once():
    both = {r: _state(True, True, {"world": 2}, [["world", 2, "all_sum", "float32", [2]]]) for r in (0, 1)}
    plan = drain_plan.plan(both, [0, 1])
    assert plan.wait and plan.busy and plan.frozen == [0, 1]
    # MLX's ring let rank 0 finish its all_sum #1 against rank 1's all_gather #1: both "ran" #1, nobody is behind
    one_sided = {0: _state(False, False, {"world": 1}, [["world", 1, "all_sum", "float32", [4]]]),
                 1: {**_state(True, True, {"world": 1}, [["world", 1, "all_gather", "float32", [8]]]),
                     "groups": {"world": [1, 2]}}}
    plan = drain_plan.plan(one_sided, [0, 1])
    assert not plan.wait and plan.frozen == [1]
    assert plan.why == ("collective #1 on `world` differs across ranks (all_sum float32 [4] on rank 0; "
                        "all_gather float32 [8] on rank 1)")


# ---------------------------------------------------------------- on real ranks

#: rank 1 raises while the others wait in the collective (``{op}``); ``after`` is set only where
#: a rank's code went on past its wait
RAISES = """
if world.rank() == 1:
    1/0
y = mx.distributed.{op}(mx.ones(4), group=world)
mx.eval(y)
after = True
"""


#: lazy graphs: rank 1 raises while the others evaluate several collectives at once, or only some of
#: those they built (MLX runs one evaluation's ops in the order they were made)
LAZY = {
    "three at once": """
if world.rank() == 1:
    1/0
x = mx.ones(4)
y = mx.distributed.all_gather(x, group=world)
z = mx.distributed.all_sum(x * 2, group=world)
w = mx.distributed.all_sum(mx.ones(8) * 3, group=world)
mx.eval(w, z, y)
after = True
""",
    "the later of two": """
x = mx.ones(4)
y = mx.distributed.all_sum(x, group=world)
if world.rank() == 1:
    1/0
z = mx.distributed.all_gather(x * 2, group=world)
mx.eval(z)
after = True
""",
}


def _sum_is_right(c: Cluster, n: int) -> None:
    """The next cell's collective on the same `world` gives the right result on every rank."""
    show_run(c.run("z = mx.distributed.all_sum(mx.ones(2), group=world).tolist()"), timeout=30)
    assert c.pull("z") == [[float(n)] * 2] * n


@pytest.fixture(params=["ring", "mpi"])
def backend(request, monkeypatch):
    """Each test on MLX's ring and on MPI (Open MPI's mpirun runs as root here only when told to)."""
    if request.param == "mpi" and hasattr(os, "geteuid") and os.geteuid() == 0:
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT", "1")
        monkeypatch.setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return request.param


#: the ops tried (MLX's ring and MPI backends have no sum_scatter: there it fails on every rank at once,
#: "[mpi] sum_scatter not yet implemented", and nobody waits)
OPS = ("all_sum", "all_gather", "all_max")


@pytest.mark.parametrize("n", [2, 4])
def test_a_rank_that_raises_while_the_others_wait_in_mlxs_collective_keeps_world(n, backend):
    with Cluster(n=n, backend=backend) as c:
        for op in OPS:
            with pytest.raises(DistributedCellError) as err:
                show_run(c.run(RAISES.format(op=op)), timeout=30)
            assert str(err.value).startswith("rank 1 raised ZeroDivisionError"), err.value
            shown = "\n".join(err.value.lines)
            assert "stopped (KeyboardInterrupt) because rank 1 raised ZeroDivisionError" in shown, shown
            assert "restart" not in shown, shown
            assert all(not row.get("world_closed") for row in c.status()), c.status()
            # no rank's code ran on a drained result
            show_run(c.run("went_on = 'after' in globals()"), timeout=30)
            assert c.pull("went_on") == [False] * n
            _sum_is_right(c, n)


@pytest.mark.parametrize("n", [2, 4])
def test_a_rank_that_raises_while_the_others_evaluate_a_lazy_graph_keeps_world(n, backend):
    with Cluster(n=n, backend=backend) as c:
        for code in LAZY.values():
            with pytest.raises(DistributedCellError) as err:
                show_run(c.run(code), timeout=30)
            assert str(err.value).startswith("rank 1 raised ZeroDivisionError"), err.value
            assert all(not row.get("world_closed") for row in c.status()), \
                ([row.get("world_closed") for row in c.status()], c.drainer.last)
            show_run(c.run("went_on = 'after' in globals()"), timeout=30)
            assert c.pull("went_on") == [False] * n
            _sum_is_right(c, n)


#: the ranks' loop, stopped at a random moment (no print: a stop landing in a flush is another matter)
STOPPED_LOOP = """
x = mx.ones(1000)
while True:
    mx.eval(mx.distributed.all_sum(x, group=world))
"""


def _stop_in_the_loop(c: Cluster, code: str, n: int, rng: random.Random) -> float:
    """Run ``code``; once every rank has made a few of its collectives, and a random moment later,
    press stop; the seconds until every rank ended."""
    r = c.run(code)
    deadline = time.monotonic() + 60
    while True:
        counts = [((s.get("mlx") or {}).get("counts") or {}).get("world", 0) for s in c.where_samples().values()]
        if len(counts) == n and min(counts) >= 3:
            break
        assert time.monotonic() < deadline and not r.done.is_set(), counts
    threading.Event().wait(rng.uniform(0, 0.05))   # a random moment in the loop (not a synchronisation)
    began = time.monotonic()
    r.interrupt()
    assert r.wait(10)
    took = time.monotonic() - began
    assert all(o.status == "released" for o in r.outcomes.values()), \
        ({k: (o.status, o.note[:160]) for k, o in r.outcomes.items()}, c.drainer.last)
    return took


def _assert_released_in_time(took: list[float], c: Cluster) -> None:
    """The promise: every stop released within 1 s (0.04 to 0.73 s seen at a load average of 6)."""
    assert max(took) <= RELEASE_WITHIN, (sorted(took)[-5:], c.drainer.last)


#: the stop tests run on the ring only: under MPI, ranks busy-polling a collective on this loaded 2-core
#: machine sometimes answer the control channel too late (about one stop in 50-100; issue 42's report)
RING = "ring"


@pytest.mark.parametrize("n", [2, 4])
def test_stop_during_a_loop_of_all_sums_keeps_world(n, backend=RING):
    rng = random.Random(42 + n)
    took = []
    with Cluster(n=n, backend=backend) as c:
        for _ in range(5):
            took.append(_stop_in_the_loop(c, STOPPED_LOOP, n, rng))
            assert all(not row.get("world_closed") for row in c.status()), (c.status(), c.drainer.last)
            _sum_is_right(c, n)
        _assert_released_in_time(took, c)


#: a training loop whose gradients are averaged with ``nn.average_gradients`` on `world` (one all_sum per
#: step, evaluated lazily with the update)
TRAINING = """
import mlx.nn as nn, mlx.optimizers as optim
mx.random.seed(0)
model = nn.Linear(8, 4)
opt = optim.SGD(learning_rate=0.01)
X, Y = mx.random.normal((16, 8)) + world.rank(), mx.random.normal((16, 4))
step = nn.value_and_grad(model, lambda m, x, y: nn.losses.mse_loss(m(x), y))
while True:
    loss, grads = step(model, X, Y)
    opt.update(model, nn.average_gradients(grads, group=world))
    mx.eval(model.parameters(), opt.state)
"""


@pytest.mark.parametrize("n", [2, 4])
def test_stop_during_average_gradients_fifty_times_never_loses_world(n, backend=RING):
    rng = random.Random(7 + n)
    took = []
    with Cluster(n=n, backend=backend) as c:
        for i in range(50):
            took.append(_stop_in_the_loop(c, TRAINING, n, rng))
            show_run(c.run(f"z = mx.distributed.all_sum(mx.ones(2) * (world.rank() + {i}), group=world).tolist()"),
                         timeout=30)
            want = float(sum(r + i for r in range(n)))
            assert c.pull("z") == [[want] * 2] * n, (i, c.drainer.last)
        assert all(not row.get("world_closed") for row in c.status()), c.status()
        _assert_released_in_time(took, c)


def test_a_recv_whose_partner_raised_is_drained_and_keeps_world():
    """Rank 1 raises before its send: it sends zeros that rank 0's recv takes, and rank 0 stops before its
    code sees them; `world` works in the next cell."""
    with Cluster(n=2) as c:
        with pytest.raises(DistributedCellError) as err:
            show_run(c.run("if world.rank() == 1:\n    1/0\n"
                           "got = mx.distributed.recv_like(mx.ones(3), 1, group=world)\nmx.eval(got)\nafter = True"),
                     timeout=30)
        assert str(err.value).startswith("rank 1 raised ZeroDivisionError"), err.value
        c.drainer.thread.join(5)
        assert c.drainer.last == "drained: rank 1 made send #1 on `world:1>0`", c.drainer.last
        assert all(not row.get("world_closed") for row in c.status()), c.status()
        show_run(c.run("went_on = 'after' in globals()"), timeout=30)
        assert c.pull("went_on") == [False, False]
        _sum_is_right(c, 2)


#: rank 1 does more Python work between its calls than the others: at any moment the ranks' counts differ
UNEVEN = """
x = mx.ones(1000)
i = 0
while True:
    mx.eval(mx.distributed.all_sum(x, group=world))
    i += 1
    if world.rank() == 1:
        for _ in range(20000):
            pass
"""


@pytest.mark.parametrize("n", [2, 4])
def test_an_agreed_stop_stops_every_rank_at_the_same_call(n):
    """``stop_at_boundary`` (a chat's Stop): every rank stops before its first call past the last one any rank
    had made, so all have completed the same calls (``i`` alike), none was drained, and `world` works."""
    with Cluster(n=n) as c:
        for _ in range(3):
            r = c.run(UNEVEN)
            deadline = time.monotonic() + 60
            while min([((s.get("mlx") or {}).get("counts") or {}).get("world", 0)
                       for s in c.where_samples().values()] or [0]) < 3:
                assert time.monotonic() < deadline
            assert c.stop_at_boundary(r, timeout=1.0)
            assert all(o.status == "released" and "stopped at a collective boundary" in o.evalue
                       for o in r.outcomes.values()), {k: (o.status, o.evalue) for k, o in r.outcomes.items()}
            counts = c.pull("i")
            assert len(set(counts)) == 1, counts
            _sum_is_right(c, n)


def test_a_rank_killed_while_its_peer_waits_still_gets_the_restart_naming_why():
    """SIGKILL: nobody can make the dead rank's calls (its sockets closed, the ring releases the peer by
    itself); nothing is drained, and the error names the death and the restart, as before."""
    with Cluster(n=2) as c:
        with pytest.raises(DistributedCellError) as err:
            show_run(c.run("import os, signal\nif world.rank() == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
                           "mx.eval(mx.distributed.all_sum(mx.ones(3), group=world))"), timeout=30)
        shown = str(err.value) + "\n" + "\n".join(err.value.lines)
        assert str(err.value).startswith("rank 1 died"), shown
        assert "cluster.restart()" in shown, shown
        c.drainer.thread.join(5)
        assert not c.drainer.last.startswith("drained"), c.drainer.last
