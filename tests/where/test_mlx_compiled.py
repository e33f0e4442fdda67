"""MLX's compiled functions in the record of MLX's collectives (one process: a world of one rank).

A compiled function's Python runs once per input signature (its trace); its later calls must still
count the collectives of its graph, at the caller's line, so that a drain and an agreed stop see them.
"""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")

from mlx_jupyter.where import mlx_calls  # noqa: E402


@pytest.fixture
def record():
    rec = mlx_calls.install()
    assert rec is not None
    rec.new_cell()
    yield rec
    rec.new_cell()


def _step():
    def step(x):
        return mx.distributed.all_sum(x * 2) + mx.distributed.all_max(x)
    return mx.compile(step)


def test_every_call_of_a_compiled_function_counts_its_collectives_at_the_callers_line(record):
    step = _step()
    x = mx.ones((3, 4))
    for _ in range(5):
        mx.eval(step(x))   # the first call traces; the other four run the traced graph
    assert record.counts["world"] == 10
    calls = list(record.calls)[-10:]
    assert [(c[1], c[2]) for c in calls] == [(n, "all_sum" if n % 2 else "all_max") for n in range(1, 11)]
    replayed = calls[-1]
    assert replayed[7] == "mlx.core.compile" and replayed[3] == (mx.float32, (3, 4))
    assert mlx_calls.site(replayed[5], mlx_calls.line_of(replayed[5], replayed[6])).endswith(
        "in test_every_call_of_a_compiled_function_counts_its_collectives_at_the_callers_line")


def test_each_input_signature_has_its_own_calls_and_bytes(record):
    step = _step()
    small, large = mx.ones((2,)), mx.ones((8, 8), dtype=mx.float16)
    for x in (small, large, small, large):
        mx.eval(step(x))
    shapes = [c[3] if isinstance(c[3], tuple) else (c[3].dtype, c[3].shape) for c in list(record.calls)[-8:]]
    assert [tuple(s) for _, s in shapes] == [(2,), (2,), (8, 8), (8, 8)] * 2
    before = record.nbytes
    mx.eval(step(large))
    assert record.nbytes - before == 2 * 64 * 2   # two float16 calls of 64 values, counted without tracing


def test_a_function_with_no_collective_adds_nothing(record):
    double = mx.compile(lambda x: x * 2)
    for _ in range(3):
        mx.eval(double(mx.ones(4)))
    assert record.counts.get("world", 0) == 0 and len(record.calls) == 0


def test_an_agreed_stop_stops_before_a_compiled_call_past_the_last_number(record):
    step = _step()
    x = mx.ones(4)
    mx.eval(step(x), step(x))   # calls #1-#4 made
    record.stop_after, record.stop_known = {"world": 4}, __import__("threading").Event()
    record.stop_known.set()
    with pytest.raises(KeyboardInterrupt, match=r"after MLX call #4 on `world`"):
        step(x)
    assert record.counts["world"] == 4
    record.stop_after = {"world": 6}
    mx.eval(step(x))            # another rank made #5 and #6: this one makes them too, then stops
    with pytest.raises(KeyboardInterrupt):
        step(x)
    assert record.counts["world"] == 6
    record.stop_after = None


def test_compiled_functions_are_no_methods_as_mlxs_are_not():
    class Holder:
        f = mx.compile(lambda x: x + 1)

    assert Holder().f(mx.array(1)).item() == 2


def test_a_trace_longer_than_the_record_keeps_is_not_replayed_in_part(record):
    def many(x):
        for _ in range(mlx_calls.KEEP + 3):
            x = mx.distributed.all_sum(x)
        return x

    step = mx.compile(many)
    x = mx.ones(2)
    mx.eval(step(x))                  # the trace: every call counted as it is made
    made = record.counts["world"]
    assert made == mlx_calls.KEEP + 3
    mx.eval(step(x))                  # its template is unknown: nothing is added, rather than a part of it
    assert record.counts["world"] == made
