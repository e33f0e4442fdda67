"""MLX's own collectives in a profile, in one process (MLX's 1-rank world): what a profiled call leaves (op, group,
bytes, dtype, shape, call site, a duration), a call inside mx.compile recorded without one, and the totals the
dashboard's rates come from, which survive a new cell."""

from __future__ import annotations

import sys
import types

import pytest

mx = pytest.importorskip("mlx.core")

from mlx_jupyter.collective.profile import MLX, summarize, timeline_svg  # noqa: E402
from mlx_jupyter.where import mlx_calls, mlx_profile  # noqa: E402


def _line() -> int:
    return sys._getframe(1).f_lineno


def test_a_profiled_cells_mlx_calls_are_records_with_bytes_shape_site_and_duration(world, record):
    recording = mx.distributed.all_sum
    mlx_profile.start()
    assert mx.distributed.all_sum is not recording, "timed while profiled"
    mlx_calls.new_cell()   # the profiled cell begins
    x = mx.ones((4, 256), dtype=mx.float32)
    for _ in range(5):
        y = mx.distributed.all_sum(x, group=world); line = _line()  # noqa: E702
    mx.distributed.all_gather(mx.ones(3, dtype=mx.int32))
    assert y.tolist() == x.tolist()
    records = mlx_profile.stop()
    assert mx.distributed.all_sum is recording, "stop puts the recording wrapper back"
    assert [(r.op, r.seq) for r in records] == [("all_sum", i) for i in range(1, 6)] + [("all_gather", 6)]
    first = records[0]
    assert (first.library, first.group_id, first.rank, first.size) == (MLX, "mx:world", 0, 1)
    assert (first.nbytes, first.dtype, first.shape, first.timed) == (4096, "float32", (4, 256), True)
    assert first.at == f"line {line}" or first.at.startswith(f"test_mlx_profile.py:{line} in ")
    assert all(r.end >= r.start for r in records) and records[-1].nbytes == 12
    assert mlx_calls.snapshot()["calls"][0]["at"] == first.at, "the where table's call site is the caller's too"
    summary = summarize(records).text
    assert "6 op records on 1 rank (0 of mlx_jupyter's, 6 of MLX's own mx.distributed)" in summary, summary
    assert "timed by evaluating each where it was called" in summary and "MLX all_sum #" in summary, summary
    assert "outlined: MLX" in timeline_svg(records)


def test_a_call_inside_mx_compile_is_recorded_without_a_duration(world, record):
    mlx_profile.start()
    mlx_calls.new_cell()

    def step(a):
        return mx.distributed.all_sum(a * 2, group=world)

    assert mx.compile(step)(mx.ones(8)).tolist() == [2.0] * 8
    records = mlx_profile.stop()
    assert [(r.op, r.timed, r.start == r.end) for r in records] == [("all_sum", False, True)]
    assert "1 inside mx.compile could not be timed" in summarize(records).text


def test_mlxs_own_python_calls_are_placed_at_the_users_line(world, record):
    """As ``mlx.nn.average_gradients`` does (on a 1-rank world it makes no call): the user's line and the function."""
    helper = types.ModuleType("mlx.nn.fake_profile_utils")
    exec("import mlx.core as mx\ndef average(g, group):\n    return mx.distributed.all_sum(g, group=group)\n",
         helper.__dict__)
    mlx_profile.start()
    mlx_calls.new_cell()
    helper.average(mx.ones(3), world); line = _line()  # noqa: E702
    r, = mlx_profile.stop()
    assert r.at.startswith(f"test_mlx_profile.py:{line} in ") and r.at.endswith(" via mlx.nn.fake_profile_utils.average")


def test_nothing_is_timed_after_the_profiled_cell(world, record):
    """A profile whose records nobody gathered: the next cell's calls are neither evaluated early nor recorded."""
    mlx_profile.start()
    mlx_calls.new_cell()
    mx.distributed.all_sum(mx.ones(2), group=world)
    mlx_calls.new_cell()   # a later cell
    later = mx.distributed.all_sum(mx.ones(2) + 1, group=world)
    assert [r.seq for r in mlx_profile.stop()] == [1]
    assert later.tolist() == [2.0, 2.0]


def test_totals_and_bytes_survive_a_new_cell(world, record):
    x = mx.ones(256, dtype=mx.float32)
    start_calls, start_bytes = record.totals().get("world", 0), record.nbytes
    for _ in range(3):
        mx.distributed.all_sum(x, group=world)
    mlx_calls.new_cell()
    assert record.counts == {"world": 0}, "the per-cell numbers restart (the hang diagnosis compares them)"
    for _ in range(2):
        mx.distributed.all_max(x, group=world)
    assert record.totals()["world"] - start_calls == 5
    assert record.nbytes - start_bytes == 5 * 1024
