"""What recording a profile costs per op: a 4 KiB all_sum on 2 local ranks started by
`mlx-jupyter launch`, with recording off, with it on, and (``--baseline PYTHON``, e.g. the
last landed commit's venv) on a build without the activity record and profile at all.

Timing: blocks of ops, off and on alternating (and the baseline in its own launch), each block
timed whole on each rank after a barrier; the slower rank's time per op, median over blocks.
The difference on - off is what recording adds to an op (the budget: 1 µs).

    .venv/bin/python benchmarks/profile_overhead.py [--quick] [--baseline /work/main/.venv/bin/python]
        [--save benchmarks/results/profile_overhead.txt]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from allreduce import header, saved_output
from launcher_layout import launch_ranks

RANK = r"""
import json, os, time
import numpy as np
from mlx_jupyter import distributed as dist

g = dist.init(strict=True, backend="ring", timeout=60)
rank, per, blocks = g.rank(), int(os.environ["BENCH_PER"]), int(os.environ["BENCH_BLOCKS"])
x = np.ones(1024, np.float32)
out = np.empty_like(x)
can_profile = hasattr(dist, "start_profile")
modes = ["off", "on"] if can_profile else ["off"]
for _ in range(200):
    dist.all_sum(x, out=out)
times = {m: [] for m in modes}
for b in range(blocks):
    for mode in modes if b % 2 == 0 else modes[::-1]:
        if mode == "on":
            dist.start_profile(capacity=per)
        g.barrier()
        t0 = time.perf_counter()
        for _ in range(per):
            dist.all_sum(x, out=out)
        times[mode].append((time.perf_counter() - t0) / per)
        if mode == "on":
            records = dist.stop_profile()
            assert sum(r.op == "all_sum" for r in records) == per, len(records)
assert (out == g.size()).all()
with open(os.path.join(os.environ["BENCH_OUT"], f"rank-{rank}.json"), "w") as fh:
    json.dump(times, fh)
"""


def run(python: str, per: int, blocks: int) -> dict[str, float]:
    """One launch of 2 ranks with ``python``: mode -> the slower rank's seconds per op, median over blocks."""
    ranks = launch_ranks(2, {"BENCH_PER": str(per), "BENCH_BLOCKS": str(blocks)}, code=RANK, python=python,
                         timeout=600)
    return {m: statistics.median(max(a, b) for a, b in zip(ranks[0][m], ranks[1][m])) for m in ranks[0]}


def singleton(per: int, blocks: int) -> dict[str, float]:
    """The same on a 1-rank group in this process: no peer, so the op is its bookkeeping alone
    and the difference stands out of the noise of a loaded machine. Mode -> seconds per op."""
    import time

    import numpy as np

    from mlx_jupyter import _core
    from mlx_jupyter import distributed as dist
    from mlx_jupyter.collective.group import CoreGroup

    g = CoreGroup(_core.Group.world(0, [[]], _core.CoreOptions(), -1.0), "singleton")
    x, out = np.ones(1024, np.float32), np.empty(1024, np.float32)
    times: dict[str, list[float]] = {"off": [], "on": []}
    for b in range(blocks * 5):
        for mode in ("off", "on") if b % 2 == 0 else ("on", "off"):
            if mode == "on":
                dist.start_profile(capacity=per * 10)
            t0 = time.perf_counter()
            for _ in range(per * 10):
                dist.all_sum(x, group=g, out=out)
            times[mode].append((time.perf_counter() - t0) / (per * 10))
            if mode == "on":
                dist.stop_profile()
    g.close("done")
    return {m: statistics.median(t) for m, t in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run: few blocks (noisy figures)")
    ap.add_argument("--baseline", metavar="PYTHON", help="also time ranks run by this interpreter (another build)")
    ap.add_argument("--save", metavar="FILE", help="also write the output to FILE")
    args = ap.parse_args()
    per, blocks = (500, 6) if args.quick else (2000, 20)
    lines = [*header(),
             f"4 KiB float32 all_sum, 2 local ranks (mlx-jupyter launch), {blocks} blocks of {per} ops; "
             "slower rank's time per op, median over blocks"]
    ours = run(sys.executable, per, blocks)
    lines.append(f"  recording off: {ours['off'] * 1e6:8.2f} µs")
    lines.append(f"  recording on:  {ours['on'] * 1e6:8.2f} µs   on/off {ours['on'] / ours['off']:.3f}, "
                 f"on - off {(ours['on'] - ours['off']) * 1e6:+.2f} µs per op (budget: 1 µs)")
    one = singleton(per, blocks)
    lines.append(f"1-rank group in one process (the op's bookkeeping alone), {blocks * 5} blocks of {per * 10} ops:")
    lines.append(f"  recording off: {one['off'] * 1e6:8.3f} µs   on: {one['on'] * 1e6:8.3f} µs   "
                 f"on - off {(one['on'] - one['off']) * 1e9:+.0f} ns per op")
    if args.baseline:
        base = run(args.baseline, per, blocks)
        lines.append(f"  baseline ({args.baseline}): {base['off'] * 1e6:8.2f} µs   "
                     f"off/baseline {ours['off'] / base['off']:.3f}")
    with saved_output(args.save):
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
