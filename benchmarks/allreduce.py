"""All-reduce benchmark: our core's all_sum against MLX's ring all_sum and Open MPI
(through mpi4py), all in one run, on local ranks. Prints median latency, bus
bandwidth and ratios: time ratios (lower is better for us) and bandwidth ratios
(higher is better for us).

    .venv/bin/python benchmarks/allreduce.py [--ranks 2,3,4] [--max-mib 64] [--transport auto|tcp] [--quick]

Needs mpirun and mpi4py for the Open MPI column (skipped, with a note, otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

TIMING = r"""
import json, os, statistics, time
import numpy as np
sizes = json.loads(os.environ["BENCH_SIZES"])
scale = float(os.environ.get("BENCH_SCALE", "1"))

def measure(fn, nbytes, barrier):
    iters = max(3, int(scale * max(5, min(2000, int(4e8 // max(nbytes, 1))))))
    for _ in range(max(3, iters // 5)):  # warm up: caches, pages, scheduler placement
        fn()
    barrier()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter(); fn(); times.append(time.perf_counter() - t0)
    return statistics.median(times)
"""

OURS_AND_MLX = TIMING + r"""
import mlx.core as mx
from mlx_jupyter import distributed as dist
g = dist.init(strict=True, backend="ring", timeout=60)
rows = []
for nbytes in sizes:  # ours first, before MLX's ring (and its threads) exist in the process
    x = np.ones(nbytes // 4, np.float32); out = np.empty_like(x)
    rows.append({"bytes": nbytes, "ours": measure(lambda: dist.all_sum(x, out=out), nbytes, g.barrier)})
w = mx.distributed.init(strict=True, backend="ring")
for row in rows:
    xm = mx.ones(row["bytes"] // 4, dtype=mx.float32); mx.eval(xm)
    row["mlx"] = measure(lambda: mx.eval(mx.distributed.all_sum(xm, group=w)), row["bytes"], g.barrier)
if g.rank() == 0:
    print("BENCH " + json.dumps({"rows": rows, "links": g._core.link_kinds()}), flush=True)
"""

OPEN_MPI = TIMING + r"""
from mpi4py import MPI
c = MPI.COMM_WORLD
rows = []
for nbytes in sizes:
    x = np.ones(nbytes // 4, np.float32); out = np.empty_like(x)
    rows.append({"bytes": nbytes, "mpi": measure(lambda: c.Allreduce(x, out), nbytes, c.Barrier)})
if c.rank == 0:
    print("BENCH " + json.dumps({"rows": rows}), flush=True)
"""


def human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def bench_line(out: str) -> dict:
    return json.loads(next(ln for ln in out.splitlines() if ln.startswith("BENCH "))[6:])


def run_ours(n: int, sizes: list[int], transport: str, scale: float) -> dict:
    from mlx_jupyter.net.ports import free_port_block

    with tempfile.TemporaryDirectory() as tmp:
        hf = os.path.join(tmp, "hosts.json")
        with open(hf, "w") as fh:
            base = free_port_block(n)
            json.dump([[f"127.0.0.1:{base + r}"] for r in range(n)], fh)
        env = {**os.environ, "MLX_HOSTFILE": hf, "BENCH_SIZES": json.dumps(sizes), "BENCH_SCALE": str(scale),
               "MLX_JUPYTER_TOKEN": os.urandom(8).hex(), "MLX_JUPYTER_TRANSPORT": transport}
        procs = [subprocess.Popen([sys.executable, "-c", OURS_AND_MLX], env={**env, "MLX_RANK": str(r)}, cwd=tmp,
                                  stdout=subprocess.PIPE, text=True) for r in range(n)]
        outs = [p.communicate(timeout=1800)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"benchmark ranks failed (n={n})")
    return bench_line(outs[0])


def run_mpi(n: int, sizes: list[int], scale: float) -> dict | None:
    mpirun = shutil.which("mpirun")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        mpirun = None
    if not mpirun:
        return None
    cmd = [mpirun, "-n", str(n), "--oversubscribe"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    env = {**os.environ, "BENCH_SIZES": json.dumps(sizes), "BENCH_SCALE": str(scale)}
    p = subprocess.run(cmd + [sys.executable, "-c", OPEN_MPI], env=env,
                       capture_output=True, text=True, timeout=1800)
    if p.returncode:
        print(f"(Open MPI run failed: {p.stderr.strip()[-300:]})")
        return None
    return bench_line(p.stdout)


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:6.2f}" if a and b else f"{'-':>6}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,3,4", help="comma-separated world sizes (default 2,3,4)")
    ap.add_argument("--max-mib", type=int, default=64)
    ap.add_argument("--transport", default="auto", choices=["auto", "tcp"], help="our core's transport")
    ap.add_argument("--quick", action="store_true", help="a smoke run: a tenth of the iterations (noisy figures)")
    args = ap.parse_args()
    scale = 0.1 if args.quick else 1.0
    sizes, s = [], 4096
    while s <= args.max_mib << 20:
        sizes.append(s)
        s *= 4
    missing_mpi = False
    for n in [int(x) for x in args.ranks.split(",")]:
        ours = run_ours(n, sizes, args.transport, scale)
        mpi = run_mpi(n, sizes, scale)
        missing_mpi |= mpi is None
        mpi_rows = {r["bytes"]: r["mpi"] for r in mpi["rows"]} if mpi else {}
        print(f"\nall_sum float32, {n} local ranks, our links {sorted(set(k.split(':')[1] for k in ours['links']))}; "
              "median latency in µs; bus bandwidth = bytes * 2(n-1)/n / time, in GB/s")
        print(f"{'':>8} | {'latency':^29} | {'bus bandwidth':^20} | {'time ratio':^13} | {'bandwidth ratio':^13}")
        print(f"{'size':>8} | {'ours':>9} {'MLX':>9} {'MPI':>9} | {'ours':>6} {'MLX':>6} {'MPI':>6} | "
              f"{'/MLX':>6} {'/MPI':>6} | {'xMLX':>6} {'xMPI':>6}")
        for r in ours["rows"]:
            b = r["bytes"]
            bus = b * 2 * (n - 1) / n / 1e9
            m = mpi_rows.get(b)
            mpi_t = f"{m * 1e6:9.1f}" if m else f"{'-':>9}"
            mpi_bw = f"{bus / m:6.2f}" if m else f"{'-':>6}"
            print(f"{human(b):>8} | {r['ours'] * 1e6:9.1f} {r['mlx'] * 1e6:9.1f} {mpi_t} | "
                  f"{bus / r['ours']:6.2f} {bus / r['mlx']:6.2f} {mpi_bw} | "
                  f"{ratio(r['ours'], r['mlx'])} {ratio(r['ours'], m)} | {ratio(r['mlx'], r['ours'])} {ratio(m, r['ours'])}")
    print("\ntime ratio: ours / theirs (below 1: we are faster); bandwidth ratio: ours / theirs (above 1: we move more)")
    if missing_mpi:
        print("(Open MPI column empty: install openmpi-bin and libopenmpi-dev, then `.venv/bin/pip install mpi4py`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
