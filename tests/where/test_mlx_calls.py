"""The record of MLX's collectives in one process (MLX's 1-rank world): what a call leaves, what it keeps
of the arrays, and what it costs (issue 32 §1: at most 2 µs per call)."""

from __future__ import annotations

import gc
import os
import re
import shutil
import subprocess
import statistics
import sys
import timeit
import types
import weakref

import pytest

mx = pytest.importorskip("mlx.core")

from mlx_jupyter.where import mlx_calls  # noqa: E402


def _line() -> int:
    return sys._getframe(1).f_lineno


def test_a_call_is_noted_with_its_number_shape_and_line_and_its_result_is_mlxs(world, record):
    x = mx.arange(6, dtype=mx.float32)
    y = mx.distributed.all_sum(x, group=world); line = _line()  # noqa: E702
    assert y.tolist() == mx.distributed.all_sum.__wrapped__(x, group=world).tolist()
    mx.distributed.all_gather(mx.ones((2, 3), dtype=mx.int32))
    snap = mlx_calls.snapshot()
    assert snap["counts"]["world"] == 2
    first, second = snap["calls"]
    assert (first["op"], first["seq"], first["dtype"], first["shape"]) == ("all_sum", 1, "float32", [6])
    assert first["at"] == f"test_mlx_calls.py:{line} in test_a_call_is_noted_with_its_number_shape_and_line_and_its_result_is_mlxs"
    assert (second["op"], second["seq"], second["dtype"], second["shape"]) == ("all_gather", 2, "int32", [2, 3])


def test_a_small_input_is_kept_until_the_next_cell_a_large_one_never(world, record):
    small = mx.ones(4)
    large = mx.zeros(mlx_calls.HOLD_BYTES // 4 + 1)
    mx.distributed.all_sum(small, group=world)
    mx.distributed.all_sum(large, group=world)
    kept = [c[3] for c in record.calls]
    assert kept[0] is small, "a small input is kept whole: its dtype and shape are read when a sample asks"
    assert kept[1] == (mx.float32, (mlx_calls.HOLD_BYTES // 4 + 1,)), "a large one's are read at once"
    assert [c["shape"] for c in mlx_calls.snapshot()["calls"]] == [[4], [mlx_calls.HOLD_BYTES // 4 + 1]]
    gone = weakref.ref(small)
    del small, kept
    mlx_calls.new_cell()
    gc.collect()
    assert gone() is None, "a new cell lets the record's arrays go"


def test_the_record_keeps_the_newest_calls_and_counts_them_all(world, record):
    x = mx.ones(2)
    seen = []
    for _ in range(3 * mlx_calls.KEEP):
        mx.distributed.all_max(x, group=world)
        seen.append(record.made())
    assert seen == list(range(1, 3 * mlx_calls.KEEP + 1)), "every call changes what the sampler compares"
    snap = mlx_calls.snapshot()
    assert snap["counts"] == {"world": 3 * mlx_calls.KEEP}
    assert [c["seq"] for c in snap["calls"]] == list(range(3 * mlx_calls.KEEP - mlx_calls.SENT + 1, 3 * mlx_calls.KEEP + 1))
    assert len(record.calls) == mlx_calls.KEEP
    mlx_calls.new_cell()
    assert mlx_calls.snapshot() == {"counts": {"world": 0}, "groups": {"world": [0, 1]}, "calls": []}
    mx.distributed.all_max(x, group=world)
    assert mlx_calls.snapshot()["calls"][0]["seq"] == 1, "numbers start again with each cell"


def test_a_call_from_mlxs_own_python_is_placed_at_the_users_line(world, record):
    """As ``mlx.nn.average_gradients`` would be (on a 1-rank world it makes no call): a function of a module
    named ``mlx.…`` calls the collective; the record names the user's line and the MLX function."""
    helper = types.ModuleType("mlx.nn.fake_utils")
    exec("import mlx.core as mx\ndef average(g, group):\n    return mx.distributed.all_sum(g, group=group)\n",
         helper.__dict__)
    helper.average(mx.ones(3), world); line = _line()  # noqa: E702
    call = mlx_calls.snapshot()["calls"][-1]
    assert call["at"] == f"test_mlx_calls.py:{line} in test_a_call_from_mlxs_own_python_is_placed_at_the_users_line"
    assert call["via"] == "mlx.nn.fake_utils.average"
    mx.distributed.all_sum(mx.ones(3), group=world); line = _line()  # noqa: E702
    assert mlx_calls.snapshot()["calls"][-1]["via"] is None, "the user's own calls again after MLX's"


def test_the_record_costs_under_2_microseconds_per_call(world, record):
    """The issue's budget for a tiny op (1 % or 2 µs, whichever is larger), timed in alternating blocks
    with the record on and off; the fastest block of each (the least disturbed on a shared machine), and
    up to three rounds: a round that other processes' load spoils is timed again."""
    x = mx.ones(1024)

    def build() -> None:
        mx.distributed.all_sum(x, group=world)

    said = []
    for _ in range(3):
        times: dict[bool, list[float]] = {True: [], False: []}
        for b in range(16):
            for on in (True, False) if b % 2 == 0 else (False, True):
                mlx_calls.enable(on)
                times[on].append(timeit.timeit(build, number=5000) / 5000)
                mlx_calls.new_cell()
        cost = min(times[True]) - min(times[False])
        if cost < 2e-6:
            return
        said.append(f"{cost * 1e6:.2f} µs (median on {statistics.median(times[True]) * 1e6:.2f} µs, "
                    f"off {statistics.median(times[False]) * 1e6:.2f} µs)")
    pytest.fail(f"the record costs more than 2 µs per call in three rounds: {'; '.join(said)}")


#: callgrind's count of the record's instructions per all_sum (Python 3.11 here: about 4700, of which about 480 the
#: dashboard's byte total, one addition of a new int; the record that read the input's dtype and shape at every call
#: took about 5900)
INSTRUCTIONS = 5000

COUNTED = """
import sys
import mlx.core as mx
from mlx_jupyter.where import mlx_calls
mlx_calls.install()
world = mx.distributed.init()
x = mx.ones(1024)
mlx_calls.enable(sys.argv[1] == "on")
def build():
    mx.distributed.all_sum(x, group=world)
for _ in range(int(sys.argv[2])):
    build()
"""


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_the_record_costs_few_instructions_per_call():
    """Instructions do not depend on the machine's load: callgrind counts a run of N calls with the record on less one
    with it off (both at once: each process's count is its own), over N."""
    def counts(*runs: tuple[str, int]) -> list[int]:
        procs = [subprocess.Popen(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                                   "-c", COUNTED, mode, str(n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONHASHSEED": "0"}) for mode, n in runs]
        found = []
        try:
            for proc in procs:
                _, err = proc.communicate(timeout=600)
                match = re.search(r"Collected : (\d+)", err)
                assert proc.returncode == 0 and match, err[-2000:]
                found.append(int(match.group(1)))
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        return found

    n = 20000
    on, off = counts(("on", n), ("off", n))
    if (on - off) / n >= INSTRUCTIONS:   # the count without calls only for the message: it cancels out above
        start, = counts(("on", 0))
        pytest.fail(f"the record takes {(on - off) / n:.0f} instructions per call ({(off - start) / n:.0f} without it)")
