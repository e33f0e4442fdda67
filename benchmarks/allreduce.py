"""All-reduce benchmark: our core's all_sum against MLX's ring all_sum and Open MPI
(through mpi4py), all in the same rank processes, on local ranks.

mpirun starts the ranks (its default binding) when Open MPI and mpi4py are there;
each rank then forms our group and, later, MLX's ring from MLX's environment
contract. Ours and Open MPI are timed in 10 alternating blocks per size, so a
change of the machine's state during the run (on this VM, core-to-core latency
doubles for minutes at a time) reaches both columns alike; MLX's ring runs after.
Each iteration is timed on every rank; the figure for an iteration is the slower
rank's time (max over ranks), and a size's figure is the median of those. Every
iteration's output is compared with the expected sum (outside the timed call); a
wrong result fails the run. Calls go through the public API:
`dist.all_sum(x, group=g, out=out)` on numpy float32, `mx.distributed.all_sum`,
`comm.Allreduce(x, out)`. Prints latency, bus bandwidth, ratios, and the lines
the table of docs/performance.md quotes; `--save FILE` also writes the output there.

    .venv/bin/python benchmarks/allreduce.py [--ranks 2,3,4] [--max-mib 64] [--transport auto|tcp] [--quick]
        [--save benchmarks/results/allreduce.txt]
    .venv/bin/python benchmarks/allreduce.py --layout launcher --ranks 2 [--runs 5] [--sizes 4096]
        [--save benchmarks/results/allreduce_launcher.txt]

The launcher layout (launcher_layout.py) runs ours in ranks started by `mlx-jupyter launch`,
as users start them, and Open MPI in ranks started by mpirun, in alternated runs.

Without mpirun or mpi4py this script starts the ranks itself and the Open MPI
column stays empty (with a note).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout

from mlx_jupyter.launch.mpi import outside_enclosing_job

# Starts the code of every benchmark's ranks (launch() puts it first): MPI, this rank, the sizes.
RANK_PROLOGUE = r"""
import json, os, sys, time
import numpy as np
sys.path.insert(0, os.environ["BENCH_DIR"])
from rank_timing import checker, measure, rank_setup
comm, RANK, sizes, scale = rank_setup()
USE_MPI = comm is not None
"""

# Run on every rank. All three libraries run in the same processes: one launch's CPU
# placement and the machine's state at the time are shared by every column.
RANK_CODE = r"""
from mlx_jupyter import distributed as dist
g = dist.init(strict=True, backend="ring", timeout=60)
n = g.size()
want_v = float(sum(range(1, n + 1)))
times = {"ours": {}, "mpi": {}, "mlx": {}}
for nbytes in sizes:  # ours and Open MPI first, before MLX's ring (and its threads) exist in the process
    x = np.full(nbytes // 4, RANK + 1, np.float32)
    want = np.full_like(x, want_v)
    out, out_mpi = np.empty_like(x), np.empty_like(x)
    runners = {"ours": (lambda: dist.all_sum(x, group=g, out=out), checker(want, "ours", RANK), g.barrier,
                        lambda: out.fill(-1))}
    if USE_MPI:
        runners["mpi"] = (lambda: (comm.Allreduce(x, out_mpi), out_mpi)[1], checker(want, "Open MPI", RANK),
                          comm.Barrier, lambda: out_mpi.fill(-1))
    for name, t in measure(runners, nbytes, scale).items():
        times[name][nbytes] = t
import mlx.core as mx
w = mx.distributed.init(strict=True, backend="ring")
for nbytes in sizes:
    xm = mx.full((nbytes // 4,), RANK + 1, dtype=mx.float32); mx.eval(xm)
    want = np.full(nbytes // 4, want_v, np.float32)
    def call_mlx():
        r = mx.distributed.all_sum(xm, group=w); mx.eval(r); return r
    times["mlx"][nbytes] = measure({"mlx": (call_mlx, checker(want, "MLX ring", RANK), g.barrier, lambda: None)},
                                   nbytes, scale)["mlx"]
cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
with open(os.path.join(os.environ["BENCH_OUT"], f"rank-{RANK}.json"), "w") as fh:
    json.dump({"times": times, "links": g.link_kinds(), "cpus": cpus}, fh)
"""


@contextmanager
def saved_output(path: str | None) -> Iterator[None]:
    """Prints as usual and, given a path, also writes everything printed to that file at the end."""
    buf = io.StringIO()

    class Tee(io.TextIOBase):
        def write(self, text: str) -> int:
            sys.__stdout__.write(text)
            sys.__stdout__.flush()
            return buf.write(text)

    with redirect_stdout(Tee()):
        yield
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as fh:
            fh.write(buf.getvalue())


def header(*about: str) -> list[str]:
    """A run's first lines: the command that ran it, then the machine (platform, cores, Python, ``about``
    (e.g. MLX's version), load average)."""
    command = [os.path.basename(sys.executable), f"benchmarks/{os.path.basename(sys.argv[0])}", *sys.argv[1:]]
    machine = [platform.platform(), f"{os.cpu_count()} cores", f"Python {platform.python_version()}", *about,
               f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"]
    return [f"$ {' '.join(command)}", ", ".join(machine)]


def human(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def slower_rank_median(per_rank: list[dict], tag: str) -> dict[int, float] | None:
    """Per size: the median over iterations of the max over ranks (None: that library did not run)."""
    columns_by_size = [d["times"][tag] for d in per_rank]
    if not columns_by_size[0]:
        return None
    return {int(size): statistics.median(max(it) for it in zip(*(c[size] for c in columns_by_size)))
            for size in columns_by_size[0]}


def mpirun_command(n: int) -> list[str] | None:
    """mpirun for n local ranks, or None when Open MPI or mpi4py is missing."""
    mpirun = shutil.which("mpirun")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    if not mpirun:
        return None
    cmd = [mpirun, "-n", str(n), "--oversubscribe"]
    return cmd + ["--allow-run-as-root"] if os.geteuid() == 0 else cmd


def launch(n: int, code: str, env_extra: dict[str, str], transport: str, out_dir: str) -> tuple[list[dict], bool]:
    """Runs `code` on n local ranks (mpirun starts them when Open MPI is there, with BENCH_MPI=1);
    returns what each rank wrote to BENCH_OUT/rank-R.json, and whether mpirun started them.
    `code` runs after RANK_PROLOGUE."""
    from mlx_jupyter.vocab.ports import free_port_block

    hf = os.path.join(out_dir, "hosts.json")
    with open(hf, "w") as fh:
        base = free_port_block(n)
        json.dump([[f"127.0.0.1:{base + r}"] for r in range(n)], fh)
    env = {**os.environ, **env_extra, "MLX_HOSTFILE": hf, "BENCH_OUT": out_dir,
           "BENCH_DIR": os.path.dirname(os.path.abspath(__file__)), "MLX_JUPYTER_TOKEN": os.urandom(8).hex(),
           "MLX_JUPYTER_TRANSPORT": transport}
    mpirun = mpirun_command(n)
    code = RANK_PROLOGUE + code
    if mpirun:
        procs = [subprocess.Popen(mpirun + [sys.executable, "-c", code],
                                  env={**outside_enclosing_job(env), "BENCH_MPI": "1"}, cwd=out_dir)]
    else:
        procs = [subprocess.Popen([sys.executable, "-c", code], env={**env, "MLX_RANK": str(r)}, cwd=out_dir)
                 for r in range(n)]
    try:
        codes = [p.wait(timeout=1800) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(codes):
        raise SystemExit(f"benchmark ranks failed (n={n}, exit codes {codes})")
    per_rank = []
    for r in range(n):
        with open(os.path.join(out_dir, f"rank-{r}.json")) as fh:
            per_rank.append(json.load(fh))
    return per_rank, bool(mpirun)


def run_ranks(n: int, sizes: list[int], transport: str, scale: float, out_dir: str) -> dict:
    """One launch of n ranks timing every library."""
    per_rank, by_mpirun = launch(n, RANK_CODE, {"BENCH_SIZES": json.dumps(sizes), "BENCH_SCALE": str(scale)},
                                 transport, out_dir)
    return {"ours": slower_rank_median(per_rank, "ours"), "mlx": slower_rank_median(per_rank, "mlx"),
            "mpi": slower_rank_median(per_rank, "mpi"), "links": per_rank[0]["links"],
            "cpus": [d["cpus"] for d in per_rank], "mpirun": by_mpirun}


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:6.2f}" if a and b else f"{'-':>6}"


def us(t: float | None) -> str:
    return "-" if t is None else f"{t * 1e6:.1f} µs" if t < 1e-4 else f"{t * 1e6:.0f} µs"


def gbs(nbytes: int, n: int, t: float | None) -> str:
    return "-" if t is None else f"{nbytes * 2 * (n - 1) / n / t / 1e9:.2f} GB/s"


def table(n: int, links: list[str], ours: dict, mlx: dict, mpi: dict | None) -> None:
    board = ", small sizes through the board" if "board:shm" in links else ""
    print(f"\nall_sum float32, {n} local ranks, our links {sorted(set(k.split(':')[1] for k in links))}{board}; "
          "slower rank's time per iteration, median, in µs; bus bandwidth = bytes * 2(n-1)/n / time, in GB/s")
    print(f"{'':>8} | {'latency':^29} | {'bus bandwidth':^20} | {'time ratio':^13} | {'bandwidth ratio':^13}")
    print(f"{'size':>8} | {'ours':>9} {'MLX':>9} {'MPI':>9} | {'ours':>6} {'MLX':>6} {'MPI':>6} | "
          f"{'/MLX':>6} {'/MPI':>6} | {'xMLX':>6} {'xMPI':>6}")
    for b, t in ours.items():
        bus = b * 2 * (n - 1) / n / 1e9
        m = (mpi or {}).get(b)
        mpi_t = f"{m * 1e6:9.1f}" if m else f"{'-':>9}"
        mpi_bw = f"{bus / m:6.2f}" if m else f"{'-':>6}"
        print(f"{human(b):>8} | {t * 1e6:9.1f} {mlx[b] * 1e6:9.1f} {mpi_t} | "
              f"{bus / t:6.2f} {bus / mlx[b]:6.2f} {mpi_bw} | "
              f"{ratio(t, mlx[b])} {ratio(t, m)} | {ratio(mlx[b], t)} {ratio(m, t)}")


def readme_lines(runs: dict[int, tuple], transport: str) -> list[str]:
    """The rows docs/performance.md quotes (4 KiB latency, 64 MiB bandwidth per rank count), from this run."""
    rows = []
    small, large = min(next(iter(runs.values()))[0]), max(next(iter(runs.values()))[0])
    for n, (ours, mlx, mpi, links) in runs.items():
        mpi = mpi or {}
        kind = "TCP (`--transport tcp`)" if transport == "tcp" else "shared memory"
        rows.append(f"| all_sum float32, {n} ranks ({kind}), {human(small)} / {human(large)} | "
                    f"{us(ours[small])} / {gbs(large, n, ours[large])} | "
                    f"MLX ring {us(mlx[small])} / {gbs(large, n, mlx[large])}, "
                    f"Open MPI {us(mpi.get(small))} / {gbs(large, n, mpi.get(large))} |")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,3,4", help="comma-separated world sizes (default 2,3,4)")
    ap.add_argument("--max-mib", type=int, default=64)
    ap.add_argument("--transport", default="auto", choices=["auto", "tcp"], help="our core's transport")
    ap.add_argument("--quick", action="store_true", help="a smoke run: a tenth of the iterations (noisy figures)")
    ap.add_argument("--save", metavar="FILE", help="also write the output to FILE (e.g. benchmarks/results/allreduce.txt)")
    ap.add_argument("--layout", default="shared", choices=["shared", "launcher"],
                    help="shared: every library in mpirun's processes; launcher: ours started by "
                         "`mlx-jupyter launch`, Open MPI by mpirun, in alternated runs (launcher_layout.py)")
    ap.add_argument("--runs", type=int, default=5, help="launcher layout: alternated runs")
    ap.add_argument("--sizes", help="launcher layout: comma-separated byte counts (default 4096)")
    ap.add_argument("--scale", type=float, help="iteration factor (default 1, 0.1 with --quick)")
    args = ap.parse_args()
    scale = args.scale if args.scale is not None else 0.1 if args.quick else 1.0
    if args.layout == "launcher":
        return launcher_main(args, scale)
    sizes, s = [], 4096
    while s <= args.max_mib << 20:
        sizes.append(s)
        s *= 4
    with saved_output(args.save):
        import mlx.core as mx

        print("\n".join(header(f"MLX {mx.__version__}")))
        runs: dict[int, tuple] = {}
        missing_mpi = False
        for n in [int(x) for x in args.ranks.split(",")]:
            with tempfile.TemporaryDirectory() as out_dir:
                r = run_ranks(n, sizes, args.transport, scale, out_dir)
            missing_mpi |= r["mpi"] is None
            runs[n] = (r["ours"], r["mlx"], r["mpi"], r["links"])
            table(n, r["links"], r["ours"], r["mlx"], r["mpi"])
            print(f"started by {'mpirun (its default binding)' if r['mpirun'] else 'this script'}; "
                  f"CPUs each rank may run on: {r['cpus']}")
        print("\ntime ratio: ours / theirs (below 1: we are faster); bandwidth ratio: ours / theirs (above 1: we move more)")
        print("every iteration's result was checked on every rank (all equal to the expected sum)")
        if missing_mpi:
            print("(Open MPI column empty: install openmpi-bin and libopenmpi-dev, then `.venv/bin/pip install mpi4py`)")
        print("\nsummary rows (docs/performance.md):")
        for line in readme_lines(runs, args.transport):
            print(line)
    return 0


def launcher_main(args: argparse.Namespace, scale: float) -> int:
    """The launcher layout: each library in the processes its own launcher starts."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from launcher_layout import run_layout

    sizes = [int(x) for x in (args.sizes or "4096").split(",")]
    with saved_output(args.save):
        print("\n".join(header()))
        for n in [int(x) for x in args.ranks.split(",")]:
            run_layout(mpirun_command(n), n, sizes, scale, args.runs, human)
        print("ratio: ours / Open MPI time (below 1: we are faster); every result was checked on every rank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
