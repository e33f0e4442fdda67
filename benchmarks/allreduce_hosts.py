"""All-reduce over 4 namespace hosts (veth + TCP, real sshd): our core vs MLX's ring vs Open MPI.

    .venv/bin/python benchmarks/allreduce_hosts.py [--per-host 1,2] [--max-mib 64] [--quick]

Needs root (tests/testbed.py makes the hosts), mpirun and mpi4py for the Open MPI column.
Our ranks are started by ``mlx-jupyter launch --hosts`` over ssh with MLX_JUPYTER_TRANSPORT=tcp;
each rank runs our all_sum, then MLX's ring all_sum (``mx.distributed.init(backend="ring")`` on
the launcher's hostfile of namespace addresses) in the same processes. Open MPI runs over ssh
to the same hosts with ``--mca btl tcp,self``. Timing rule for every column: each rank times
each iteration; per iteration the slowest rank's time counts; the figure is the median of those.
Every result is checked (sum of rank+1 over ranks) outside the timed call.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlx_jupyter.launch.mpi import outside_enclosing_job  # noqa: E402

WORKER = r"""
import json, os, sys, time
import numpy as np
sizes = json.loads(os.environ["BENCH_SIZES"])
scale = float(os.environ.get("BENCH_SCALE", "1"))
outdir = os.environ["BENCH_OUT"]

def measure(step, check, nbytes, barrier):
    iters = max(3, int(scale * max(5, min(100, int(2e8 // max(nbytes, 1))))))
    for _ in range(max(2, iters // 5)):  # warm up: caches, pages, connections
        check(step())
    barrier()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter(); r = step(); times.append(time.perf_counter() - t0)
        check(r)
    return times

def checker(expected):
    def check(r):
        a = np.asarray(r)
        if not (a == expected).all():
            raise SystemExit(f"wrong all_sum result: expected {expected}, got {a.ravel()[:4]}...")
    return check

def dump(kind, rank, rows):
    with open(os.path.join(outdir, f"{kind}-{rank}.json"), "w") as f:
        json.dump(rows, f)

if os.environ.get("BENCH_MODE") == "mpi":
    from mpi4py import MPI
    c = MPI.COMM_WORLD
    rank, n = c.rank, c.size
    expected = n * (n + 1) / 2
    rows = {}
    for nbytes in sizes:
        x = np.full(nbytes // 4, rank + 1, np.float32); out = np.empty_like(x)
        def step():
            c.Allreduce(x, out); return out
        rows[nbytes] = measure(step, checker(expected), nbytes, c.Barrier)
    dump("mpi", rank, rows)
else:
    import mlx.core as mx
    from mlx_jupyter import distributed as dist
    g = dist.init(strict=True, backend="ring", timeout=120)
    rank, n = g.rank(), g.size()
    expected = n * (n + 1) / 2
    rows = {}
    for nbytes in sizes:  # ours first, before MLX's ring (and its threads) exist in the process
        x = np.full(nbytes // 4, rank + 1, np.float32); out = np.empty_like(x)
        rows[nbytes] = measure(lambda: dist.all_sum(x, out=out), checker(expected), nbytes, g.barrier)
    dump("ours", rank, rows)
    if rank == 0:
        with open(os.path.join(outdir, "links.json"), "w") as f:
            json.dump(g._core.link_kinds(), f)
    w = mx.distributed.init(strict=True, backend="ring")
    assert w.size() == n
    rows = {}
    for nbytes in sizes:
        xm = mx.full((nbytes // 4,), rank + 1, dtype=mx.float32); mx.eval(xm)
        def step():
            y = mx.distributed.all_sum(xm, group=w); mx.eval(y); return y
        rows[nbytes] = measure(step, checker(expected), nbytes, g.barrier)
    dump("mlx", rank, rows)
"""


def human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def slowest_rank_median(outdir: Path, kind: str, n: int) -> dict[int, float]:
    """Per size: per iteration the max over ranks, then the median of those."""
    ranks = [json.loads((outdir / f"{kind}-{r}.json").read_text()) for r in range(n)]
    return {int(b): statistics.median(max(it) for it in zip(*(rk[b] for rk in ranks))) for b in ranks[0]}


def run_ours(bed, per_host: int, script: Path, env: dict, outdir: Path) -> None:
    cmd = [sys.executable, "-m", "mlx_jupyter", "launch", "--hosts", ",".join(bed.ips), "-n", str(per_host),
           "--backend", "ring", *bed.cli_ssh_args(), "--cwd", str(outdir)]
    for k, v in env.items():
        cmd += ["--env", f"{k}={v}"]
    p = subprocess.run(cmd + [str(script)], capture_output=True, text=True, timeout=1800)
    if p.returncode:
        raise SystemExit(f"our ranks failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")


def run_mpi(bed, per_host: int, script: Path, env: dict, outdir: Path) -> str | None:
    """Open MPI over ssh to the bed's hosts, TCP only; None when done, else why not."""
    mpirun = shutil.which("mpirun")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        mpirun = None
    if not mpirun:
        return "mpirun or mpi4py missing (apt-get install openmpi-bin libopenmpi-dev; pip install mpi4py)"
    cfg = bed.write_ssh_config(outdir / "ssh_config", {ip: i for i, ip in enumerate(bed.ips, 1)})
    subnet = f"{bed.net}.0/24"
    cmd = [mpirun, "--allow-run-as-root", "-np", str(per_host * len(bed.ips)),
           "--host", ",".join(f"{ip}:{per_host}" for ip in bed.ips),
           "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", subnet, "--mca", "oob_tcp_if_include", subnet,
           "--mca", "plm_rsh_agent", f"ssh -F {cfg}", "--mca", "plm_rsh_no_tree_spawn", "1",
           "--wdir", str(outdir)]
    forwarded = {**env, "BENCH_MODE": "mpi"}
    for k in forwarded:   # by name: values on mpirun's command line are readable by every user
        cmd += ["-x", k]
    run_env = {**outside_enclosing_job(os.environ), **forwarded, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    p = subprocess.run(cmd + [sys.executable, str(script)], capture_output=True, text=True, timeout=1800, env=run_env)
    if p.returncode:
        return f"mpirun failed ({p.returncode}): {(p.stderr or p.stdout).strip()[-600:]}"
    return None


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:6.2f}" if a and b else f"{'-':>6}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=4, help="namespace hosts (default 4)")
    ap.add_argument("--per-host", default="1,2", help="ranks per host, comma-separated (default 1,2)")
    ap.add_argument("--max-mib", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="a tenth of the iterations (noisy figures)")
    args = ap.parse_args()
    from tests.testbed import TestBed, missing_requirements

    why = missing_requirements()
    if why:
        raise SystemExit(f"cannot make namespace hosts: {why}")
    sizes, s = [], 4096
    while s <= args.max_mib << 20:
        sizes.append(s)
        s *= 16
    if sizes[-1] != args.max_mib << 20:
        sizes.append(args.max_mib << 20)
    verdicts = []
    with tempfile.TemporaryDirectory(prefix="abh-") as tmp:
        bed = TestBed(Path(tmp) / "bed", args.hosts)
        # own name prefix: cleanup of test beds (mjK-...) left behind by test runs must not take this one
        bed.prefix, bed.bridge = f"abh{bed.k}", f"abh{bed.k}-br"
        bed.up()
        try:
            script = Path(tmp) / "abh_rank.py"
            script.write_text(WORKER)
            for per_host in [int(x) for x in args.per_host.split(",")]:
                n = per_host * args.hosts
                outdir = Path(tmp) / f"run{per_host}"
                outdir.mkdir()
                env = {"BENCH_SIZES": json.dumps(sizes), "BENCH_SCALE": "0.1" if args.quick else "1",
                       "BENCH_OUT": str(outdir), "MLX_JUPYTER_TRANSPORT": "tcp"}
                run_ours(bed, per_host, script, env, outdir)
                ours, mlx = slowest_rank_median(outdir, "ours", n), slowest_rank_median(outdir, "mlx", n)
                links = sorted(set(k.split(":")[1] for k in json.loads((outdir / "links.json").read_text())))
                why_not = run_mpi(bed, per_host, script, env, outdir)
                mpi = slowest_rank_median(outdir, "mpi", n) if why_not is None else {}
                print(f"\nall_sum float32, {args.hosts} namespace hosts x {per_host} rank(s) = {n} ranks, veth + TCP; "
                      f"our links {links}; Open MPI --mca btl tcp,self")
                print("latency: median over iterations of the slowest rank's time, in µs; "
                      "bus bandwidth = bytes * 2(n-1)/n / latency, in GB/s")
                print(f"{'':>8} | {'latency':^29} | {'bus bandwidth':^20} | {'time ratio':^13} | {'bandwidth ratio':^13}")
                print(f"{'size':>8} | {'ours':>9} {'MLX':>9} {'MPI':>9} | {'ours':>6} {'MLX':>6} {'MPI':>6} | "
                      f"{'/MLX':>6} {'/MPI':>6} | {'xMLX':>6} {'xMPI':>6}")
                for b in sizes:
                    bus = b * 2 * (n - 1) / n / 1e9
                    o, m, p = ours[b], mlx[b], mpi.get(b)
                    mpi_t = f"{p * 1e6:9.1f}" if p else f"{'-':>9}"
                    mpi_bw = f"{bus / p:6.3f}" if p else f"{'-':>6}"
                    print(f"{human(b):>8} | {o * 1e6:9.1f} {m * 1e6:9.1f} {mpi_t} | {bus / o:6.3f} {bus / m:6.3f} {mpi_bw} | "
                          f"{ratio(o, m)} {ratio(o, p)} | {ratio(m, o)} {ratio(p, o)}")
                if why_not:
                    print(f"(Open MPI column empty: {why_not})")
                big, small = sizes[-1], sizes[0]
                verdicts.append((f"{n} ranks: bandwidth at {human(big)} >= 2x MLX's ring", mlx[big] / ours[big] >= 2,
                                 f"{mlx[big] / ours[big]:.2f}x"))
                if mpi:
                    verdicts.append((f"{n} ranks: latency at {human(small)} <= 1.0x Open MPI's",
                                     ours[small] / mpi[small] <= 1.0, f"{ours[small] / mpi[small]:.2f}x"))
                else:
                    verdicts.append((f"{n} ranks: latency at {human(small)} <= 1.0x Open MPI's", None, "not run"))
        finally:
            bed.down()
    print("\ntime ratio: ours / theirs (below 1: we are faster); bandwidth ratio: ours / theirs (above 1: we move more)")
    print("targets:")
    for what, met, fig in verdicts:
        print(f"  {({True: 'MET', False: 'MISSED', None: 'NOT CHECKED'})[met]:12} {what}: {fig}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
