"""The cost of the opt-in per-cell state record (``Cluster(record_state=True)``), record on and off
in alternating rounds on one 2-rank cluster: a trivial cell's latency, a cell of one training step of
notebooks/03's loop (the record's worst case: one record per step), then the disk and memory of
a rank holding a 1 GiB array (the first record writes it; the next ones hash it, and write nothing).

    .venv/bin/python benchmarks/state_record.py [--rounds 4] [--cells 20] [--gib 1] [--save FILE]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import time

from training_step import MODEL

SETUP = """
import numpy as np
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_map
""" + MODEL + """
def average(grads):
    return tree_map(lambda g: mx.distributed.all_sum(g, group=world) / world.size(), grads)
losses = []
"""

STEP = """
loss, grads = loss_and_grad(model, Xs, Ys)
opt.update(model, average(grads))
mx.eval(model.parameters(), opt.state)
losses.append(loss.item())
"""


def cell_times(c, code: str, count: int) -> list[float]:
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        run = c.run(code)
        run.wait(120)
        out.append(time.perf_counter() - t0)
        if run.failed:
            raise SystemExit(f"the cell failed: {run!r}")
    return out


def ms(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.2f} ms (median of {len(xs)})"


def folder_bytes(path: str) -> int:
    return int(subprocess.run(["du", "-sb", path], capture_output=True, text=True).stdout.split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4, help="rounds of (off, on), alternating (default 4)")
    ap.add_argument("--cells", type=int, default=20, help="cells of each kind per round (default 20)")
    ap.add_argument("--gib", type=float, default=1.0, help="the large array's size (default 1 GiB)")
    ap.add_argument("--save", default=None, help="also write the output to this file")
    args = ap.parse_args()
    buf = io.StringIO()

    def say(text: str) -> None:
        print(text, flush=True)
        buf.write(text + "\n")

    from mlx_jupyter.cluster import Cluster

    say(f"state record benchmark: {os.cpu_count()} cores; load average at the start: "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    times: dict[tuple[str, bool], list[float]] = {}
    with Cluster(n=2, timeout=120) as c:
        cell_times(c, SETUP, 1)
        for rnd in range(args.rounds):
            for on in (False, True) if rnd % 2 == 0 else (True, False):
                c.record(on)
                cell_times(c, "x = 1", 2)   # the first record of this round (everything) out of the timing
                c.records.describe(c, wait=60)
                times.setdefault(("trivial", on), []).extend(cell_times(c, "x = 1", args.cells))
                times.setdefault(("step", on), []).extend(cell_times(c, STEP, args.cells))
        c.record(True)
        cell_times(c, STEP, 1)
        record = c.records.describe(c, wait=60)
        for kind in ("trivial", "step"):
            off, on = times[(kind, False)], times[(kind, True)]
            say(f"{kind} cell: record off {ms(off)}, on {ms(on)}: "
                f"{(statistics.median(on) / statistics.median(off) - 1) * 100:+.1f} %")
        say(f"the record of the training namespace: {record[0]['seconds'] * 1e3:.1f} ms in the background, "
            f"{len(record[0]['names'])} names; records given up as a cell began: {record[0]['skipped']}")
        hook = c.execute("import time as _time\nfrom mlx_jupyter.cluster.rank import state_record as _sr\n"
                         "_t0 = _time.perf_counter()\nfor _ in range(20): _sr.RECORDER.cell_ended(0)\n"
                         "(_time.perf_counter() - _t0) / 20 * 1e3", timeout=120)   # 20: within the record's 0.2 s wait
        say(f"the hook at a cell's end, on the cell's own path: {float(hook[0]):.3f} ms on rank 0 "
            "(the names looked at, the lazy MLX arrays among them evaluated)")
        say(f"load average after the latency rounds: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

        c.record(True)
        rss = lambda: {r["rank"]: r["memory"] for r in c.status()}   # noqa: E731
        before = rss()
        n = int(args.gib * 2 ** 30) // 8
        t0 = time.perf_counter()
        cell_times(c, f"big = np.ones({n})", 1)
        cell_s = time.perf_counter() - t0
        first = c.records.describe(c, wait=600)
        after = rss()
        folder = os.path.dirname(first[0]["folder"] + "/")
        disk = folder_bytes(folder)
        say(f"{args.gib:g} GiB array: its cell {cell_s * 1e3:.0f} ms; the first record wrote "
            f"{first[0]['written'] / 2 ** 30:.2f} GiB in {first[0]['seconds']:.2f} s (background); "
            f"the record folder holds {disk / 2 ** 30:.2f} GiB for both ranks ({folder}, shared memory)")
        say(f"rank 0 memory: {before[0] / 2 ** 20:.0f} MiB before, {after[0] / 2 ** 20:.0f} MiB after the array "
            "and its record")
        nxt = cell_times(c, "x = 2", 3)
        second = c.records.describe(c, wait=600)
        say(f"the next cells: {ms(nxt)}; each record wrote {second[0]['written']} bytes in "
            f"{second[0]['seconds']:.2f} s (background: the array's hash)")
        say(f"disk after them: {folder_bytes(folder) / 2 ** 30:.2f} GiB; rank 0 memory "
            f"{rss()[0] / 2 ** 20:.0f} MiB")
    say(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.save:
        with open(args.save, "w") as f:
            f.write(buf.getvalue())


if __name__ == "__main__":
    sys.exit(main())
