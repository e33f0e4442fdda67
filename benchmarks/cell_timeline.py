"""Where a trivial distributed cell's time goes: timestamps on one clock (``CLOCK_MONOTONIC``, shared by
every process of the machine) in the test client, the kernel and both ranks, per step, as medians.

    .venv/bin/python benchmarks/cell_timeline.py [--cells 60] [--python .venv/bin/python] [--save FILE]

The probes are this benchmark's only: they wrap the steps' functions in the kernel and on the ranks
for the run (a few microseconds each) and are gone with the kernel.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from allreduce import header, saved_output  # noqa: E402
from guard import kernel_specs, must, new_kernel, stop  # noqa: E402

TRIVIAL = "%%mlx_distributed\nx = 1"

#: the kernel's probes: each step's start or end, appended to _tl as (name, ns)
KERNEL_PROBES = r'''
import time as _tl_time, functools as _tl_ft
from mlx_jupyter import magics as _tl_magics
from mlx_jupyter.cluster.cells import display as _tl_display, run as _tl_run
_tl = []
_tl_steps = []  # (name, main thread's CPU ns) at each mark on the main thread
import threading as _tl_threading
def _tl_mark(name):
    _tl.append((name, _tl_time.monotonic_ns()))
    if _tl_threading.current_thread() is _tl_threading.main_thread():
        _tl_steps.append((name, _tl_time.thread_time_ns()))
def _tl_wrap(obj, attr, before, after=None):
    fn = getattr(obj, attr)
    @_tl_ft.wraps(fn)
    def wrapper(*a, **kw):
        _tl_mark(before)
        try:
            return fn(*a, **kw)
        finally:
            if after:
                _tl_mark(after)
    setattr(obj, attr, wrapper)
_tl_c = _tl_magics._cluster
_tl_kernel = get_ipython().kernel
_tl_handler = _tl_kernel.shell_handlers["execute_request"]
async def _tl_execute_request(*a, _h=_tl_handler):
    _tl_mark("kernel: execute_request")
    _tl_kcpu.append(-_tl_time.thread_time_ns())
    try:
        return await _h(*a)
    finally:
        if _tl_kcpu:  # (the cell that reads the probes empties the list)
            _tl_kcpu[-1] += _tl_time.thread_time_ns()
        _tl_mark("kernel: execute_request done")
_tl_kernel.shell_handlers["execute_request"] = _tl_execute_request
_tl_kcpu = []
_tl_kdo = _tl_kernel.do_execute
async def _tl_kdo_w(*a, _f=_tl_kdo, **kw):
    _tl_mark("kernel: do_execute")
    try:
        return await _f(*a, **kw)
    finally:
        _tl_mark("kernel: do_execute done")
_tl_kernel.do_execute = _tl_kdo_w
get_ipython().events.register("pre_run_cell", lambda *a: _tl_mark("kernel: pre_run_cell"))
get_ipython().events.register("post_run_cell", lambda *a: _tl_mark("kernel: post_run_cell"))
_tl_cells = get_ipython().magics_manager.magics["cell"]
_tl_m = _tl_cells["mlx_distributed"]
def _tl_magic(line, cell, _m=_tl_m):
    _tl_mark("kernel: magic entered")
    return _m(line, cell)
_tl_cells["mlx_distributed"] = _tl_magic
_tl_wrap(_tl_c, "run", "kernel: cluster.run entered", "kernel: cluster.run returned")
_tl_wrap(_tl_c, "check_ranks", "kernel: check_ranks", "kernel: check_ranks done")
_tl_wrap(_tl_c.cell_server, "send_cells", "kernel: send_cells", "kernel: sent")
_tl_wrap(_tl_display, "show_run", "kernel: show_run", "kernel: show_run returned")
_tl_orig_reply = _tl_run.CellRun.channel_reply
def _tl_reply(self, rank, content, _o=_tl_orig_reply):
    _tl_mark(f"kernel: reply of rank {rank} read")
    return _o(self, rank, content)
_tl_run.CellRun.channel_reply = _tl_reply
'''

#: the ranks' probes (the cell channel's instance and the kernel object)
RANK_PROBES = r'''%%mlx_distributed
import time as _tl_time
from mlx_jupyter.cluster.rank import channel as _tl_channel
_tl = []
_tl_ch = _tl_channel.CHANNEL
def _tl_mark(name):
    _tl.append((name, _tl_time.monotonic_ns()))
_tl_feed = _tl_ch._reader.feed
_tl_cpu = []
def _tl_feed_w(data, _f=_tl_feed):
    _tl_cpu.append(-_tl_time.thread_time_ns())
    _tl_mark("rank: cell read")
    return _f(data)
_tl_ch._reader.feed = _tl_feed_w
_tl_exec = _tl_ch._execute
async def _tl_exec_w(msg, _f=_tl_exec):
    _tl_mark("rank: _execute started")
    return await _f(msg)
_tl_ch._execute = _tl_exec_w
_tl_k = _tl_ch.kernel
_tl_do = _tl_k.do_execute
async def _tl_do_w(*a, _f=_tl_do, **kw):
    _tl_mark("rank: do_execute")
    try:
        return await _f(*a, **kw)
    finally:
        _tl_mark("rank: do_execute done")
_tl_k.do_execute = _tl_do_w
_tl_post = _tl_ch.post
def _tl_post_w(obj, _f=_tl_post):
    if obj.get("t") == "reply":
        _tl_mark("rank: reply posting")
    try:
        return _f(obj)
    finally:
        if obj.get("t") == "reply":
            _tl_mark("rank: reply posted")
            _tl_cpu[-1] += _tl_time.thread_time_ns()
_tl_ch.post = _tl_post_w
'''

DUMP = ("import json\n_tl_ranks = _tl_c.pull('_tl')\n_tl_rcpu = _tl_c.pull('_tl_cpu')\n"
        "print('TIMELINE ' + json.dumps({'kernel': _tl, 'ranks': _tl_ranks, 'kcpu': _tl_kcpu, 'rcpu': _tl_rcpu, "
        "'steps': _tl_steps}))")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=60, help="trivial cells timed")
    ap.add_argument("--python", help="the interpreter of the kernel (another build of the package)")
    ap.add_argument("--code", default=TRIVIAL, help="the cell timed (default: the trivial distributed cell)")
    ap.add_argument("--patch", default="", help="code run in the kernel before the cells are timed (an experiment)")
    ap.add_argument("--save", help="also write the whole output here")
    args = ap.parse_args()
    with saved_output(args.save):
        print("\n".join(header()))
        with tempfile.TemporaryDirectory() as folder:
            if args.python:
                kernel_specs({"timeline": args.python}, folder)
            run(args, "timeline" if args.python else "python3")


def run(args: argparse.Namespace, kernel_name: str) -> None:
    """Probe, run the cells, and print each step's median."""
    k = new_kernel(kernel_name)
    client: list[tuple[int, int]] = []
    try:
        must(k, "%mlx_cluster start -n 2", 120)
        for _ in range(10):
            must(k, TRIVIAL)
        must(k, RANK_PROBES)
        must(k, KERNEL_PROBES)
        if args.patch:
            must(k, args.patch)
        must(k, "_tl.clear(); _tl_kcpu.clear(); _tl_steps.clear()")
        must(k, "%%mlx_distributed\n_tl.clear(); _tl_cpu.clear()")
        must(k, "_tl.clear()")
        for _ in range(args.cells):
            t0 = time.monotonic_ns()
            must(k, args.code)
            client.append((t0, time.monotonic_ns()))
        out = k.run(DUMP, 60).stdout
    finally:
        stop(k)
    line = next(x for x in out.splitlines() if x.startswith("TIMELINE "))
    data = json.loads(line[len("TIMELINE "):])
    report(client, data["kernel"], data["ranks"])
    cpu_steps(data["steps"])
    kcpu = data["kcpu"][1:]
    print(f"CPU time of the kernel's main thread per cell (execute_request): {statistics.median(kcpu) / 1e6:.2f} ms")
    for r, cpu in enumerate(data["rcpu"]):
        if len(cpu) < 2:
            continue
        print(f"CPU time of rank {r}'s main thread per cell (cell read to reply posted): "
              f"{statistics.median(cpu[1:]) / 1e6:.2f} ms")


def cpu_steps(steps: list[list]) -> None:
    """The kernel's main thread's CPU time between consecutive marks, as medians per step."""
    per: dict[str, list[float]] = {}
    for (_, t0), (name, t1) in zip(steps, steps[1:]):
        per.setdefault(name, []).append((t1 - t0) / 1e6)
    print("kernel main thread CPU ms until each mark (median):")
    for name, values in per.items():
        print(f"  {name:36} {statistics.median(values):7.3f}")


def report(client: list[tuple[int, int]], kernel: list[list], ranks: list[list[list]]) -> None:
    """Cut each process's marks into cells (by the client's windows); print the steps in time order."""
    steps: dict[str, list[float]] = {}
    order: dict[str, list[float]] = {}
    marks = [(name, t) for name, t in kernel] + [
        (name.replace("rank:", f"rank {r}:"), t) for r, rank_marks in enumerate(ranks) for name, t in rank_marks]
    for t0, t1 in client:
        cell = sorted([(t, name) for name, t in marks if t0 <= t <= t1])
        seen = [("client: execute sent", t0)] + [(name, t) for t, name in cell] + [("client: reply and idle", t1)]
        for i, (name, t) in enumerate(seen):
            order.setdefault(name, []).append((t - t0) / 1e6)
            if i:
                steps.setdefault(name, []).append((t - seen[i - 1][1]) / 1e6)
    total = statistics.median([(t1 - t0) / 1e6 for t0, t1 in client])
    print(f"{len(client)} cells, median {total:.2f} ms as the client sees it")
    print(f"{'step (its end)':36} {'at ms':>8} {'since last':>10}")
    for name in sorted(order, key=lambda n: statistics.median(order[n])):
        gap = statistics.median(steps[name]) if name in steps else 0.0
        print(f"{name:36} {statistics.median(order[name]):8.2f} {gap:10.3f}")


if __name__ == "__main__":
    main()
