"""Profiles: every op of every group recorded between start and stop (count, bytes, order), the
summary naming the straggler, and the timeline a well-formed SVG. Ranks are threads of this process."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from typing import Any, Callable

import numpy as np
import pytest

import mlx_jupyter.distributed as dist
from mlx_jupyter import _core
from mlx_jupyter.collective.group import CoreGroup
from mlx_jupyter.collective.profile import OpRecord, axis_ticks, summarize, timeline_svg

import thread_ranks

TIMEOUT = 20.0


def in_threads(n: int, body: Callable[[CoreGroup], Any], **settings: Any) -> list[Any]:
    """``n`` ranks as threads, each with the CoreOptions ``settings`` (token "t"); the bodies' results."""
    return thread_ranks.in_threads([_core.CoreOptions(token="t", **settings) for _ in range(n)], body, TIMEOUT)[0]


def workload(g: CoreGroup) -> str:
    g.all_reduce("sum", np.ones(256, np.float32), None, None)       # 1 KiB
    g.all_gather(np.ones(4, np.int64), None, None)                    # 32 B each
    g.all_reduce("max", np.ones(100_000, np.float32), None, None)   # 400 KB: the ring's large path
    g.barrier()
    return g.group_id


@pytest.mark.parametrize("n", [2, 3])
def test_every_op_is_recorded_once_per_rank_in_order(n):
    with dist.profile() as prof:
        gids = in_threads(n, workload)
    records = [r for r in prof.records if r.group_id == gids[0] and r.op != "init"]
    for rank in range(n):
        mine = sorted((r for r in records if r.rank == rank), key=lambda r: r.start)
        assert [(r.op, r.seq, r.nbytes, r.dtype) for r in mine] == [
            ("all_sum", 1, 1024, "float32"), ("all_gather", 2, 32, "int64"),
            ("all_max", 3, 400_000, "float32"), ("barrier", 4, 0, "")], mine
        assert all(r.ok and r.size == n and r.end >= r.start and 0 <= r.wait <= r.duration for r in mine), mine
        assert all(a.end <= b.start for a, b in zip(mine, mine[1:]))
    # the epoch's clock: records are within this test's time
    assert abs(records[0].start - time.time()) < 60


def test_nothing_is_recorded_when_off_and_a_new_profile_forgets_the_last():
    dist.start_profile()
    in_threads(2, workload)
    dist.stop_profile()
    with dist.profile() as prof:
        pass
    assert prof.records == []
    assert not _core.profiling()


def test_a_capacity_out_of_range_is_refused():
    for bad in (0, 10**9):
        with pytest.raises(ValueError, match="capacity must be 1 to"):
            dist.start_profile(capacity=bad)
    assert not _core.profiling()


def test_the_ring_keeps_the_newest_records():
    def many(g: CoreGroup) -> None:
        for _ in range(20):
            g.barrier()

    dist.start_profile(capacity=5)
    in_threads(2, many)
    records = dist.stop_profile()
    for rank in (0, 1):
        assert [r.seq for r in records if r.rank == rank] == [16, 17, 18, 19, 20]


@pytest.mark.parametrize("n", [2, 3])
def test_the_summary_names_the_rank_that_is_late_to_every_op(n):
    late = n - 1
    slow = 0.2   # well above what an op costs under TSan on a loaded machine (at 0.05 it once failed so)

    def body(g: CoreGroup) -> str:
        for _ in range(5):
            if g.rank() == late:
                time.sleep(slow)  # the behaviour under test: this rank is slow before each op
            g.all_reduce("sum", np.ones(64, np.float32), None, None)
        return g.group_id

    with dist.profile() as prof:
        in_threads(n, body)
    s = prof.summary()
    assert s.straggler == late, s.text
    assert f"straggler: rank {late}" in s.text
    # the late rank waited less than one of its delays in all; every other waited at least four of them
    assert s.wait_by_rank[late] < slow and all(s.wait_by_rank[k] > 4 * slow for k in range(n) if k != late), s.text
    ops = [r for r in prof.records if r.op == "all_sum" and r.rank == 0]
    assert all(r.waited_on is not None for r in ops), ops
    root = ET.fromstring(prof.svg())
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t and "all_sum #5" in t for t in titles), titles


def rec(rank: int, seq: int, start: float, end: float, wait: float, op: str = "all_sum") -> OpRecord:
    return OpRecord("core:1", rank, 2, op, seq, 16, "float32", start, end, wait, 1 - rank)


def test_summary_of_records_alone():
    records = [rec(0, 1, 0.0, 1.0, 0.9), rec(1, 1, 0.9, 1.0, 0.0), rec(0, 2, 1.0, 1.1, 0.0),
               rec(1, 2, 1.0, 1.1, 0.0), rec(0, 1, 2.0, 2.5, 0.0, "send")]
    s = summarize(records)
    assert s.straggler == 1 and s.caused[1] == pytest.approx(0.9)
    assert s.slowest[0][0].seq == 1 and s.slowest[0][0].op == "all_sum"
    assert "all_sum #1 (16 B float32) on core:1: 1.000 s, rank 0 waited 900.000 ms for rank 1" in s.text
    even = summarize([rec(0, 1, 0, 1, 0.001), rec(1, 1, 0, 1, 0.0)])
    assert even.straggler is None and "straggler: none" in even.text
    assert summarize([]).ops == 0


def test_timeline_is_well_formed_svg_and_escapes():
    records = [OpRecord("<g&>", r, 2, "all_sum", k, 8, "int64", k + 0.1 * r, k + 0.5, 0.1 * (1 - r), None)
               for r in range(2) for k in range(3)]
    root = ET.fromstring(timeline_svg(records))
    rects = list(root.iter("{http://www.w3.org/2000/svg}rect"))
    assert len(rects) >= 6
    assert ET.fromstring(timeline_svg([])).tag.endswith("svg")
    many = [OpRecord("g", 0, 1, "barrier", k, 0, "", k * 1e-7, k * 1e-7 + 5e-8, 0.0) for k in range(10_000)]
    assert len(list(ET.fromstring(timeline_svg(many)).iter("{http://www.w3.org/2000/svg}rect"))) < 1000


def test_timeline_axis_has_round_ticks_in_the_spans_unit():
    """Issue 45: 0, 100 ms, 200 ms ... rather than the span's fifths (406.021 ms)."""
    assert [label for _, label in axis_ticks(0.406021)] == ["0", "100 ms", "200 ms", "300 ms", "400 ms"]
    assert [label for _, label in axis_ticks(2.5)] == ["0", "0.5 s", "1.0 s", "1.5 s", "2.0 s", "2.5 s"]
    assert [label for _, label in axis_ticks(0.0456)][-1] == "40 ms" and len(axis_ticks(13.7)) >= 3
    records = [OpRecord("g", r, 2, "all_sum", 1, 8, "int64", 0.0, 0.406021, 0.0, None) for r in range(2)]
    svg = timeline_svg(records)
    texts = [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    assert "400 ms" in texts and not any("406" in (t or "") for t in texts)


def test_timeline_has_its_own_light_background_for_dark_themes():
    root = ET.fromstring(timeline_svg([OpRecord("g", 0, 1, "all_sum", 1, 8, "int64", 0.0, 1.0, 0.0, None)]))
    first = next(root.iter("{http://www.w3.org/2000/svg}rect"))
    assert first.get("fill") == "#ffffff" and first.get("width") == root.get("width") and root.get("fill") == "#1f1f1f"
