"""All-reduce benchmark: our core's all_sum (TCP ring) against MLX's ring all_sum,
in the same run, on local ranks. Prints median latency, bus bandwidth and ratios.

    .venv/bin/python benchmarks/allreduce.py [-n 2] [--max-mib 64]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

RANK = r"""
import json, os, statistics, sys, time
import numpy as np, mlx.core as mx
from mlx_jupyter import distributed as dist
sizes = json.loads(os.environ["BENCH_SIZES"])
g = dist.init(strict=True, backend="ring", timeout=60)
w = mx.distributed.init(strict=True, backend="ring")
rows = []
for nbytes in sizes:
    count = nbytes // 4
    iters = max(5, min(300, int(2e8 // max(nbytes, 1))))
    x = np.ones(count, np.float32); out = np.empty_like(x)
    xm = mx.ones(count, dtype=mx.float32); mx.eval(xm)
    def ours():
        dist.all_sum(x, out=out)
    def theirs():
        mx.eval(mx.distributed.all_sum(xm, group=w))
    res = {}
    for name, fn in (("ours", ours), ("mlx", theirs)):
        for _ in range(3):
            fn()
        g.barrier()
        times = []
        for _ in range(iters):
            t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
        res[name] = statistics.median(times)
    rows.append({"bytes": nbytes, **res})
if g.rank() == 0:
    print("BENCH " + json.dumps(rows), flush=True)
"""


def human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=2, help="local ranks (default 2)")
    ap.add_argument("--max-mib", type=int, default=64)
    args = ap.parse_args()
    from mlx_jupyter.demo import free_ports

    sizes, s = [], 4096
    while s <= args.max_mib << 20:
        sizes.append(s)
        s *= 4
    with tempfile.TemporaryDirectory() as tmp:
        hf = os.path.join(tmp, "hosts.json")
        with open(hf, "w") as fh:
            json.dump([[f"127.0.0.1:{p}"] for p in free_ports(args.n)], fh)
        env = {**os.environ, "MLX_HOSTFILE": hf, "BENCH_SIZES": json.dumps(sizes), "MLX_JUPYTER_TOKEN": os.urandom(8).hex()}
        procs = [subprocess.Popen([sys.executable, "-c", RANK], env={**env, "MLX_RANK": str(r)}, cwd=tmp,
                                  stdout=subprocess.PIPE, text=True) for r in range(args.n)]
        outs = [p.communicate(timeout=900)[0] for p in procs]
    if any(p.returncode for p in procs):
        print("benchmark ranks failed", file=sys.stderr)
        return 1
    rows = json.loads(next(ln for ln in outs[0].splitlines() if ln.startswith("BENCH "))[6:])
    n = args.n
    print(f"all_sum float32, {n} local ranks; bus bandwidth = bytes * 2(n-1)/n / time")
    print(f"{'size':>8} | {'ours µs':>10} {'MLX µs':>10} {'ours/MLX':>9} | {'ours GB/s':>9} {'MLX GB/s':>9} {'ours/MLX':>9}")
    for r in rows:
        bus = r["bytes"] * 2 * (n - 1) / n
        bo, bm = bus / r["ours"] / 1e9, bus / r["mlx"] / 1e9
        print(f"{human(r['bytes']):>8} | {r['ours'] * 1e6:>10.1f} {r['mlx'] * 1e6:>10.1f} {r['ours'] / r['mlx']:>9.2f} | "
              f"{bo:>9.2f} {bm:>9.2f} {bo / bm:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
