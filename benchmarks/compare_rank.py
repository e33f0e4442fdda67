"""The rank side of compare.py and of allreduce.py's launcher layout: times all_sum on one rank.

Runs in a rank started by our launcher (MLX_RANK/MLX_HOSTFILE), with any build of the package
since the public API `dist.init(strict=True, backend="ring")` / `all_sum(x, group=, out=)` exists:
it imports nothing else of the package, nor of this checkout. Every iteration is timed; the
times go to BENCH_OUT/rank-R.json, with the module file that ran (to show which build it was).

Settings (environment): BENCH_SIZES (JSON list of byte counts), BENCH_SCALE (iteration factor),
BENCH_OUT (folder), BENCH_MODE: `reuse` (one out= for every iteration, as a training loop does),
`fresh` (a new out= each iteration: cold pages) or `poison` (out.fill(-1) before each iteration).
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from mlx_jupyter import distributed as dist

BLOCK = 50  # iterations between barriers: both ranks start each block together


def iterations(nbytes: int, scale: float) -> int:
    """Many iterations for small messages, a dozen for 64 MiB."""
    return max(3, int(scale * max(12, min(2000, int(8e8 // max(nbytes, 1))))))


def time_size(g, rank: int, nbytes: int, scale: float, mode: str) -> list[float]:
    """Each timed iteration's seconds on this rank, after a warm-up; every result is checked."""
    n_ranks = g.size()
    x = np.full(nbytes // 4, rank + 1, np.float32)
    want = float(sum(range(1, n_ranks + 1)))
    out = np.empty_like(x)
    n = iterations(nbytes, scale)
    for _ in range(max(3, n // 5)):
        dist.all_sum(x, group=g, out=out)
    times: list[float] = []
    clock = time.perf_counter
    while len(times) < n:
        g.barrier()
        for _ in range(min(BLOCK, n - len(times))):
            if mode == "fresh":
                out = np.empty_like(x)
            elif mode == "poison":
                out.fill(-1)
            t0 = clock()
            dist.all_sum(x, group=g, out=out)
            times.append(clock() - t0)
            if out[0] != want or out[-1] != want:
                raise SystemExit(f"all_sum of {nbytes} bytes: wrong result on rank {rank}")
    if not np.all(out == want):
        raise SystemExit(f"all_sum of {nbytes} bytes: wrong result on rank {rank}")
    return times


def main() -> None:
    rank = int(os.environ["MLX_RANK"])
    sizes = json.loads(os.environ["BENCH_SIZES"])
    scale = float(os.environ.get("BENCH_SCALE", "1"))
    mode = os.environ.get("BENCH_MODE", "reuse")
    g = dist.init(strict=True, backend="ring", timeout=60)
    times = {str(b): time_size(g, rank, b, scale, mode) for b in sizes}
    g.barrier()
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    with open(os.path.join(os.environ["BENCH_OUT"], f"rank-{rank}.json"), "w") as fh:
        json.dump({"times": times, "module": dist.__file__, "cpus": cpus, "links": g.link_kinds()
                   if hasattr(g, "link_kinds") else []}, fh)


if __name__ == "__main__":
    main()
