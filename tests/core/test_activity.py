"""The activity record: another thread sees where each rank's op is (which op, on whom it waits)
while the op is blocked, without locks. Ranks are threads of this process, as in test_core_options."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np
import pytest

from mlx_jupyter import _core
from mlx_jupyter.collective import activity
from mlx_jupyter.collective.activity import OpActivity
from mlx_jupyter.collective.call_tracker import CallTracker
from mlx_jupyter.collective.group import CoreGroup

import thread_ranks

TIMEOUT = 20.0


def in_threads(options: Sequence[_core.CoreOptions], body: Callable[[CoreGroup], Any],
               watch: Callable[[], Any]) -> tuple[list[Any], Any]:
    """thread_ranks.in_threads with watch() in this thread; whatever watch() does, ``release`` is set
    afterwards so that ranks held on it go on."""
    def watched() -> Any:
        try:
            return watch()
        finally:
            release.set()

    return thread_ranks.in_threads(options, body, TIMEOUT, watched)


release = threading.Event()


@pytest.fixture(autouse=True)
def _fresh_release():
    release.clear()
    yield
    release.set()


def wait_for_snapshot(pred: Callable[[list[OpActivity]], bool], within: float = 10.0) -> list[OpActivity]:
    """Snapshots until one matches ``pred``: that snapshot (or the last one, on timeout)."""
    end = time.monotonic() + within
    while True:
        snap = activity.snapshot()
        if pred(snap) or time.monotonic() > end:
            return snap
        time.sleep(0.01)  # polling a condition with a deadline, not synchronising


def wait_for(pred: Callable[[OpActivity], bool], within: float = 10.0) -> list[OpActivity]:
    """Snapshots until one activity matches ``pred``: that snapshot (or the last one, on timeout)."""
    return wait_for_snapshot(lambda snap: any(pred(a) for a in snap), within)


def mine(snap: list[OpActivity], group_id: str, rank: int) -> OpActivity:
    return next(a for a in snap if a.group_id == group_id and a.rank == rank)


@pytest.mark.parametrize("shm", [True, False])
def test_a_rank_blocked_in_all_sum_shows_the_peer_it_waits_for(shm):
    x = np.ones(1024, np.float32)  # 4 KiB

    def body(g: CoreGroup) -> Any:
        if g.rank() == 1:
            release.wait(TIMEOUT)  # rank 1 is late
        g.all_reduce("sum", x, None, None)
        g.all_reduce("sum", x, None, None)
        return g.activity(), g.group_id

    def rank_1_seen_as_rank_0_waits(snap: list[OpActivity]) -> bool:
        # rank 0 can wait in its all_sum while rank 1 still forms the group (seen under ASan): one
        # snapshot must hold both
        return any(a.rank == 0 and a.state == "waiting" and any(b.rank == 1 and b.group_id == a.group_id for b in snap)
                   for a in snap)

    def watch() -> list[OpActivity]:
        return wait_for_snapshot(rank_1_seen_as_rank_0_waits)

    results, snap = in_threads([_core.CoreOptions(token="t", shm=shm)] * 2, body, watch)
    gid = results[0][1]
    a = mine(snap, gid, 0)
    assert (a.state, a.op, a.seq, a.nbytes, a.dtype, a.waiting_on, a.size) == (
        "waiting", "all_sum", 1, 4096, "float32", 1, 2), a
    assert 0 < a.elapsed < TIMEOUT and a.timeout == TIMEOUT  # no timeout= given: the group's default
    late = mine(snap, gid, 1)
    assert (late.state, late.op) == ("idle", None), late  # between init and its all_sum
    # once done: idle, the last op's number and bytes kept, both ways moved
    for after, _ in results:
        assert (after.state, after.op, after.seq, after.nbytes, after.waiting_on) == ("idle", None, 2, 4096, None)
        assert after.moved == 2 * 4096, after


def test_a_waiting_op_carries_its_own_timeout():
    """The timeout the op was given (or the group's default) is in the record; none is None."""
    def body(g: CoreGroup) -> Any:
        if g.rank() == 1:
            release.wait(TIMEOUT)
        g.all_reduce("sum", np.ones(4, np.float32), None, 45.0)
        return g.activity(), g.group_id

    results, snap = in_threads([_core.CoreOptions(token="t")] * 2, body,
                               lambda: wait_for(lambda a: a.rank == 0 and a.state == "waiting"))
    a = mine(snap, results[0][1], 0)
    assert (a.state, a.timeout) == ("waiting", 45.0), a
    assert all(after.timeout is None for after, _ in results)  # idle: no op, no timeout


def test_three_ranks_on_the_board_wait_for_the_missing_one():
    def body(g: CoreGroup) -> Any:
        if g.rank() == 2:
            release.wait(TIMEOUT)
        g.all_reduce("sum", np.ones(16, np.int64), None, None)
        return g.group_id

    def watch() -> list[OpActivity]:
        # One snapshot must show both ranks waiting on rank 2 (rank 1 may still be forming the world
        # while rank 0 already waits, on its neighbour, in the board's join).
        return wait_for_snapshot(lambda snap: {a.rank: a.waiting_on for a in snap
                                               if a.rank in (0, 1) and a.state == "waiting"} == {0: 2, 1: 2})

    results, snap = in_threads([_core.CoreOptions(token="t")] * 3, body, watch)
    waiting = {a.rank: a.waiting_on for a in snap if a.group_id == results[0] and a.state == "waiting"}
    assert waiting == {0: 2, 1: 2}, snap


def test_a_blocked_recv_waits_on_its_source():
    def body(g: CoreGroup) -> Any:
        if g.rank() == 1:
            release.wait(TIMEOUT)
            g.send(np.arange(8, dtype=np.int32), 0, None)
        else:
            g.recv((8,), "int32", "numpy", 1, None, None)
        return g.group_id

    results, snap = in_threads([_core.CoreOptions(token="t", shm=False)] * 2, body,
                               lambda: wait_for(lambda a: a.op == "recv" and a.state == "waiting"))
    a = mine(snap, results[0], 0)
    assert (a.op, a.seq, a.nbytes, a.dtype, a.waiting_on) == ("recv", 1, 32, "int32", 1), a


def test_snapshot_never_waits_for_the_op_lock():
    """snapshot() from many threads while an op holds the group's op lock: each returns at once."""
    def body(g: CoreGroup) -> Any:
        if g.rank() == 1:
            release.wait(TIMEOUT)
        g.barrier()
        return g.group_id

    def watch() -> float:
        wait_for(lambda a: a.op == "barrier" and a.state == "waiting")
        start = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: [activity.snapshot() for _ in range(200)], range(4)))
        return time.monotonic() - start

    _, spent = in_threads([_core.CoreOptions(token="t")] * 2, body, watch)
    assert spent < 5.0


def test_a_group_freed_leaves_the_snapshot():
    class Fake:
        group_id = "fake"

        def activity(self) -> OpActivity:
            return OpActivity("fake", 0, 1, "idle", None, 0, 0, "", 0.0, None, 0)

    f = Fake()
    activity.register(f)
    assert any(a.group_id == "fake" for a in activity.snapshot())
    del f
    import gc

    gc.collect()
    assert not any(a.group_id == "fake" for a in activity.snapshot())


def test_mlx_groups_calls_show_as_running():
    class FakeMlx:
        group_id, backend, aborted = "mlx-mpi:1", "mpi", False

        def rank(self) -> int:
            return 0

        def size(self) -> int:
            return 2

    tracker = CallTracker(FakeMlx())
    with tracker.op("all_sum", np.zeros(4, np.float32)):
        a = tracker.activity()
    assert (a.state, a.op, a.seq, a.nbytes, a.dtype, a.waiting_on) == ("running", "all_sum", 1, 16, "float32", None)
    assert tracker.activity().state == "idle" and tracker.activity().seq == 1
