"""Where a small all_sum's time goes: 2 local ranks started by `mlx-jupyter launch`.

Per size (4 B and 4 KiB of float32, `out=` reused), on each rank: the call as Python sees it
(perf_counter around `dist.all_sum`), and the core's own record of the op (the native profile:
from taking the op to its end). The difference is the Python call and the binding (argument
checks, the buffers, the GIL). The 4 B op is one synchronisation between the ranks; what 4 KiB
adds to it is moving and reducing the bytes across cores. No doorbell rings while the peer
spins; the doorbell and the wake-up are measured apart: rank 1 arrives late, 200 µs (within the
core's spin, spin.h) or 2 ms (beyond it: rank 0 sleeps and rank 1's doorbell wakes it); the cost
is how much later rank 0 returns than rank 1 (one clock: same machine), beyond the same gap when
both arrive together.

    .venv/bin/python benchmarks/small_op_breakdown.py [--ops 20000] [--save benchmarks/results/small_op_breakdown.txt]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys

from allreduce import saved_output
from launcher_layout import launch_ranks

RANK = r"""
import json, os, time
import numpy as np
from mlx_jupyter import distributed as dist

g = dist.init(strict=True, backend="ring", timeout=60)
rank, ops = g.rank(), int(os.environ["BENCH_OPS"])
clock = time.perf_counter
result = {}
for nbytes in (4, 4096):
    x = np.full(nbytes // 4, rank + 1, np.float32)
    out = np.empty_like(x)
    for _ in range(500):
        dist.all_sum(x, group=g, out=out)
    dist.start_profile(capacity=ops)
    calls = []
    g.barrier()
    for _ in range(ops):
        t0 = clock()
        dist.all_sum(x, group=g, out=out)
        calls.append(clock() - t0)
    records = [r for r in dist.stop_profile() if r.op == "all_sum"]
    assert (out == 3).all() and len(records) == ops
    result[str(nbytes)] = {"call": calls, "core": [r.duration for r in records]}
# The wake-up: rank 1 arrives `late` after rank 0 (busy-waiting, to be exact); both note when they return.
x = np.ones(1024, np.float32)
out = np.empty_like(x)
for late in (0.0, 200e-6, 2e-3):
    ends = []
    for _ in range(int(os.environ["BENCH_WAKES"])):
        g.barrier()
        if rank == 1:
            t = clock() + late
            while clock() < t:
                pass
        dist.all_sum(x, group=g, out=out)
        ends.append(clock())
    result[f"ends_{late}"] = ends
with open(os.path.join(os.environ["BENCH_OUT"], f"rank-{rank}.json"), "w") as fh:
    json.dump(result, fh)
"""


def run(ops: int, wakes: int) -> list[dict]:
    return launch_ranks(2, {"BENCH_OPS": str(ops), "BENCH_WAKES": str(wakes)}, code=RANK, timeout=600)


def us(values: list[float]) -> float:
    return statistics.median(values) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=20000, help="timed ops per size")
    ap.add_argument("--wakes", type=int, default=2000, help="ops per wake-up measurement")
    ap.add_argument("--save", help="also write the output to this file")
    args = ap.parse_args()
    lines = [f"$ python benchmarks/small_op_breakdown.py --ops {args.ops} --wakes {args.wakes}",
             f"{platform.platform()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
             f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", ""]
    ranks = run(args.ops, args.wakes)
    lines.append("median µs per op, per rank (rank 0 / rank 1)")
    core = {}
    for size in ("4", "4096"):
        call = [us(r[size]["call"]) for r in ranks]
        core[size] = [us(r[size]["core"]) for r in ranks]
        lines.append(f"{size:>5} B: the call {call[0]:.2f} / {call[1]:.2f}; in the core {core[size][0]:.2f} / "
                     f"{core[size][1]:.2f}; Python call + binding {call[0] - core[size][0]:.2f} / "
                     f"{call[1] - core[size][1]:.2f}")
    moving = [core["4096"][r] - core["4"][r] for r in range(2)]
    lines.append(f"moving and reducing 4 KiB across cores (4 KiB op - 4 B op, in the core): "
                 f"{moving[0]:.2f} / {moving[1]:.2f}")
    gaps = {late: us([a - b for a, b in zip(ranks[0][f"ends_{late}"], ranks[1][f"ends_{late}"])])
            for late in (0.0, 200e-6, 2e-3)}
    lines.append(f"rank 0 returns after rank 1 by {gaps[0.0]:.2f} µs when both arrive together; with rank 1 "
                 f"200 µs late (rank 0 spins) {gaps[200e-6]:.2f} µs; 2 ms late (rank 0 sleeps) {gaps[2e-3]:.2f} µs: "
                 f"the doorbell and the wake-up cost {gaps[2e-3] - gaps[0.0]:.2f} µs")
    lines.append(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with saved_output(args.save):
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
