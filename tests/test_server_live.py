"""Every cluster read live alike (issue 45): MLX's memory in the samples and the series, the headline only
for a rank that has stalled, a kernel's cluster read through the server's own handle on it."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import types

from mlx_jupyter.server.history import ClusterHistory
from mlx_jupyter.server.live import LiveState
from mlx_jupyter.server.stall import STALL_S, StallWatch
from mlx_jupyter.server.watched import WatchedClusters
from mlx_jupyter.where import mlx_memory, model


def waiting(seq: int, elapsed: float = 0.0, still: float = 0.0) -> dict:
    """Rank 0 in our core's all_sum #seq waiting on rank 1 (rank 1 is a step ahead)."""
    return {"rank": 0, "running": True, "line": 4, "still": still,
            "activity": [{"group": "core:1", "state": "waiting", "op": "all_sum", "seq": seq, "elapsed": elapsed,
                          "waiting_on": 1}]}


def ahead(seq: int) -> dict:
    return {"rank": 1, "running": True, "line": 4,
            "activity": [{"group": "core:1", "state": "running", "op": "all_sum", "seq": seq + 3, "elapsed": 0.0}]}


def look(watch: StallWatch, now: float, samples: dict) -> str:
    return watch.headline(now, model.rows(samples, {}, [0, 1]), samples)


def test_mlx_memory_is_read_only_where_mlx_is_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "mlx.core", raising=False)
    assert mlx_memory.read() is None                      # nothing imported, nothing loaded for it
    assert "mlx.core" not in sys.modules
    fake = types.SimpleNamespace(get_active_memory=lambda: 10, get_peak_memory=lambda: 30,
                                 metal=types.SimpleNamespace(get_cache_memory=lambda: 5))
    monkeypatch.setitem(sys.modules, "mlx.core", fake)
    assert mlx_memory.read() == {"active": 10, "peak": 30, "cache": 5}   # an older MLX's mx.metal too


def test_the_series_carry_mlx_active_peak_and_cache_per_rank():
    h = ClusterHistory(min_gap=0)
    h.add(0.0, {0: {"rss": 100, "mlx_memory": {"active": 1, "peak": 3, "cache": 2}}, 1: {"rss": 100}})
    s = h.series()["ranks"]
    assert (s["0"]["mlx_active"], s["0"]["mlx_peak"], s["0"]["mlx_cache"]) == ([1], [3], [2])
    assert s["1"]["mlx_active"] == [None] and s["1"]["memory"] == [100]   # a rank without MLX: gaps


def test_a_healthy_loop_caught_waiting_is_no_alarm():
    """Each look finds rank 0 waiting on rank 1 for 0.0 s, in a newer op each time: progress."""
    watch = StallWatch()
    for i in range(10):
        assert look(watch, 100.0 + i, {0: waiting(25363 + 40 * i), 1: ahead(25363 + 40 * i)}) == ""


def test_a_rank_stuck_in_one_op_is_the_headline_after_two_seconds_of_looks():
    watch = StallWatch()
    stuck = {0: waiting(7), 1: {"rank": 1, "running": True, "line": 3, "source": "time.sleep(60)", "activity": []}}
    assert look(watch, 100.0, stuck) == ""
    assert look(watch, 101.0, stuck) == ""
    assert look(watch, 100.0 + STALL_S, stuck).startswith("rank 0 is in all_sum #7")


def test_the_ranks_own_clock_raises_it_at_the_first_look():
    """Rank 0's op has lasted 2.5 s by its own record: the first look is enough (a panel looking every 2 s)."""
    assert "waiting on rank 1" in look(StallWatch(), 100.0, {0: waiting(7, elapsed=2.5), 1: ahead(7)})
    assert "waiting on rank 1" in look(StallWatch(), 100.0, {0: waiting(7, still=3.0), 1: ahead(7)})


def test_mismatched_mlx_calls_are_no_stall_to_wait_for():
    row = model.RankRow(0, "in MLX all_sum ... which does not match", "mismatch world #3", waiting=True, says="x")
    assert StallWatch().stalled(0.0, [row], {}) == float("inf")


def test_a_look_fills_the_rows_memory_where_and_the_charts():
    live = LiveState(history=ClusterHistory(min_gap=0))
    rows = [{"rank": 0, "health": "ok", "state": "idle"}, {"rank": 1, "health": "ok", "state": "running a cell"}]
    samples = {0: {"rank": 0, "running": False, "rss": 2**20, "cpu": 1.0},
               1: {"rank": 1, "running": True, "rss": 2**21, "line": 2, "source": "x = 1",
                   "mlx_memory": {"active": 4096, "peak": 8192, "cache": 0}}}
    assert live.look(1.0, rows, samples).headline == ""
    assert [r["where"] for r in rows] == ["idle", "running line 2: x = 1"]
    assert [r["memory_text"] for r in rows] == ["1.0 MiB", "2.0 MiB"] and rows[1]["mlx_memory"]["peak"] == 8192
    assert live.history.series()["ranks"]["1"]["mlx_active"] == [4096]


class Handle:
    """A connected handle as the watch uses it: where samples, stop."""

    def __init__(self):
        self.stopped = threading.Event()

    def where_samples(self, ranks, timeout):
        return {0: {"rank": 0, "running": False, "rss": 2**20}}

    def stop(self):
        self.stopped.set()


def test_the_watch_connects_off_the_callers_path_and_lets_go_of_a_stopped_cluster():
    made, gate = [], threading.Event()

    def connect(entry):
        gate.wait(10)
        made.append(Handle())
        return made[-1]

    watched = WatchedClusters(connect=connect)
    entry = {"id": "mlx-k", "client_file": "/x.json", "controller_pid": 1}
    assert watched.samples(entry, 0.5) is None             # the connection is being made: no wait here
    gate.set()
    watched.watches["mlx-k"].pending.result(10)
    assert watched.samples(entry, 0.5)[0]["rss"] == 2**20
    watched.samples({**entry, "controller_pid": 2}, 0.5)   # another controller: the old handle goes
    assert made[0].stopped.is_set()
    watched.watches["mlx-k"].pending.result(10)
    watched.keep(set())                                    # no longer published
    assert made[1].stopped.is_set() and watched.live("mlx-k") is None
    watched.close()


def test_a_failed_connection_is_tried_again_only_after_the_retry():
    calls = []

    def connect(entry):
        calls.append(entry["id"])
        raise RuntimeError("no controller")

    watched = WatchedClusters(connect=connect, retry=3600)
    entry = {"id": "mlx-k"}
    watched.samples(entry, 0.5)
    try:
        watched.watches["mlx-k"].pending.result(10)
    except RuntimeError:
        pass
    assert watched.samples(entry, 0.5) is None and watched.samples(entry, 0.5) is None and calls == ["mlx-k"]
    watched.close()


class Reachable:
    """The server's handles, with a kernel's ranks answering: rank 1 in a cell."""

    def __init__(self):
        self.states: dict = {}

    def keep(self, ids):
        pass

    def samples(self, entry, timeout):
        self.states.setdefault(entry["id"], LiveState(history=ClusterHistory(min_gap=0)))
        return {0: {"rank": 0, "running": False, "rss": 2**20, "ops": []},
                1: {"rank": 1, "running": True, "rss": 2**21, "line": 3, "source": "train()",
                    "mlx_memory": {"active": 2**30, "peak": 2**31, "cache": 2**20}}}

    def live(self, cluster_id):
        return self.states.get(cluster_id)

    def close(self):
        pass


def test_a_kernels_cluster_gets_memory_where_and_charts_like_the_panels(tmp_path, monkeypatch):
    """%mlx_cluster start's cluster (the README's path): its dashboard has the same rows and series."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))
    from mlx_jupyter.cluster import registry
    from mlx_jupyter.server.manager import ClusterManager

    folder = registry.folder()
    folder.mkdir(parents=True)
    (folder / "mlx-k.json").write_text(json.dumps({
        "id": "mlx-k", "owner": "kernel", "owner_pid": os.getpid(), "backend": "ring", "hosts": ["127.0.0.1"],
        "size": 2, "busy": [1], "ranks": [{"rank": r, "host": "127.0.0.1", "pid": os.getpid()} for r in range(2)]}))

    async def mine():
        return {os.getpid(): "train.ipynb"}

    m = ClusterManager(kernel_pids=mine, watched=Reachable())
    item = asyncio.run(m.dashboard("mlx-k"))
    assert [r["memory_text"] for r in item["ranks"]] == ["1.0 MiB", "2.0 MiB"]
    assert [r["where"] for r in item["ranks"]] == ["idle", "running line 3: train()"]
    assert item["ranks"][1]["mlx_memory"] == {"active": 2**30, "peak": 2**31, "cache": 2**20}
    assert item["series"]["ranks"]["1"]["mlx_peak"] == [2**31] and item["diagnosis"] == ""


def test_a_rank_that_did_not_answer_keeps_the_owners_words_where_asked():
    """A kernel's cluster: the server's 0.5 s wait missed rank 1's answer this time; its row says what the owner
    says ("idle"), not "no reply" one look and "idle" the next."""
    rows = [{"rank": 0, "health": "ok", "state": "idle"}, {"rank": 1, "health": "ok", "state": "idle"}]
    LiveState().look(1.0, rows, {0: {"rank": 0, "running": False}}, say_no_reply=False)
    assert [r["where"] for r in rows] == ["idle", ""]
    ours = [{"rank": 0, "state": "idle"}, {"rank": 1, "state": "idle"}]
    LiveState().look(1.0, ours, {0: {"rank": 0, "running": False}})
    assert [r["where"] for r in ours] == ["idle", "no reply"]
