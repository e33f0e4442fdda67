"""allreduce.py's launcher layout: each library in the processes its own launcher starts.

Ours: ranks started by `mlx-jupyter launch -n N` (as users start them), timing
`dist.all_sum(x, group=g, out=out)` (compare_rank.py). Open MPI: ranks started by `mpirun`,
timing `comm.Allreduce(x, out)`. Both time every iteration on every rank in blocks of 50
after a barrier, reuse one out=, and check results; an iteration counts its slower rank,
a run's figure is the median. Runs alternate which library goes first.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from mlx_jupyter.launch.mpi import outside_enclosing_job

HERE = Path(__file__).resolve().parent

# Open MPI's side: the same timing loop as compare_rank.py, over mpi4py.
MPI_RANK_CODE = r"""
import json, os, sys, time
import numpy as np
from mpi4py import MPI
sys.path.insert(0, os.environ["BENCH_DIR"])
from compare_rank import BLOCK, iterations
comm = MPI.COMM_WORLD
rank, n = comm.rank, comm.size
scale = float(os.environ["BENCH_SCALE"])
times = {}
for nbytes in json.loads(os.environ["BENCH_SIZES"]):
    x = np.full(nbytes // 4, rank + 1, np.float32)
    out = np.empty_like(x)
    want = float(sum(range(1, n + 1)))
    count = iterations(nbytes, scale)
    for _ in range(max(3, count // 5)):
        comm.Allreduce(x, out)
    got = []
    while len(got) < count:
        comm.Barrier()
        for _ in range(min(BLOCK, count - len(got))):
            t0 = time.perf_counter()
            comm.Allreduce(x, out)
            got.append(time.perf_counter() - t0)
            if out[0] != want or out[-1] != want:
                raise SystemExit(f"Open MPI: wrong result on rank {rank}")
    times[str(nbytes)] = got
with open(os.path.join(os.environ["BENCH_OUT"], f"rank-{rank}.json"), "w") as fh:
    json.dump({"times": times, "module": MPI.__file__, "cpus": sorted(os.sched_getaffinity(0))}, fh)
"""


def _collect(out: str, n: int) -> list[dict]:
    per_rank = []
    for r in range(n):
        with open(os.path.join(out, f"rank-{r}.json")) as fh:
            per_rank.append(json.load(fh))
    return per_rank


def launch_ranks(n: int, env: dict[str, str], script: Optional[Path] = None, code: Optional[str] = None,
                 python: str = sys.executable, timeout: float = 900) -> list[dict]:
    """n local ranks started by our launcher (ranks run by ``python``) of ``script``, or of ``code``
    written to a file, in a temp folder given as BENCH_OUT (with ``env``); what rank r wrote to
    BENCH_OUT/rank-r.json, in rank order. Exits naming the interpreter, with the ranks' output,
    if they fail."""
    with tempfile.TemporaryDirectory() as out:
        if code is not None:
            script = Path(out, "rank.py")
            script.write_text(code)
        env = {**env, "BENCH_OUT": out}
        cmd = [sys.executable, "-m", "mlx_jupyter", "launch", "-n", str(n), "--python", python,
               *[f"--env={k}={v}" for k, v in env.items()], str(script)]
        done = subprocess.run(cmd, cwd=out, capture_output=True, text=True, timeout=timeout)
        if done.returncode:
            raise SystemExit(f"ranks of {python} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
        return _collect(out, n)


def run_ours(n: int, sizes: list[int], scale: float, timeout: float = 900) -> list[dict]:
    """n ranks of compare_rank.py started by our launcher, with this interpreter."""
    return launch_ranks(n, {"BENCH_SIZES": json.dumps(sizes), "BENCH_SCALE": str(scale)},
                        HERE / "compare_rank.py", timeout=timeout)


def run_mpi(mpirun: list[str], n: int, sizes: list[int], scale: float, timeout: float = 900) -> list[dict]:
    """n ranks started by mpirun (its default binding), timing comm.Allreduce."""
    with tempfile.TemporaryDirectory() as out:
        env = {**outside_enclosing_job(os.environ), "BENCH_SIZES": json.dumps(sizes), "BENCH_SCALE": str(scale), "BENCH_OUT": out,
               "BENCH_DIR": str(HERE)}
        for attempt in (1, 2):   # mpirun itself failed once here with exit 1 and no output: one more try
            done = subprocess.run(mpirun + [sys.executable, "-c", MPI_RANK_CODE], env=env, cwd=out,
                                  capture_output=True, text=True, timeout=timeout)
            if not done.returncode:
                return _collect(out, n)
            print(f"Open MPI ranks failed (exit {done.returncode}, try {attempt} of 2):\n{done.stdout}{done.stderr}",
                  file=sys.stderr)
        raise SystemExit(f"Open MPI ranks failed twice (exit {done.returncode}):\n{done.stdout}{done.stderr}")


def slower_rank_medians(per_rank: list[dict]) -> dict[int, float]:
    """Per size: the median over iterations of the slower rank's time."""
    return {int(s): statistics.median(max(it) for it in zip(*(d["times"][s] for d in per_rank)))
            for s in per_rank[0]["times"]}


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_layout(mpirun: list[str] | None, n: int, sizes: list[int], scale: float, runs: int,
               human) -> None:
    """Prints, per run and in total, ours and Open MPI's times and their ratio, with the load."""
    print(f"\nlauncher layout: {n} ranks; ours started by `mlx-jupyter launch -n {n}`, Open MPI by "
          f"`{' '.join(mpirun[:3]) if mpirun else 'mpirun (missing)'}`; {runs} alternated runs; "
          "slower rank per iteration, median, in µs")
    ours_runs: list[dict[int, float]] = []
    mpi_runs: list[dict[int, float]] = []
    for k in range(runs):
        before = load()
        first_ours = k % 2 == 0
        for which in ("ours", "mpi") if first_ours else ("mpi", "ours"):
            if which == "ours":
                ours_runs.append(slower_rank_medians(run_ours(n, sizes, scale)))
            elif mpirun:
                mpi_runs.append(slower_rank_medians(run_mpi(mpirun, n, sizes, scale)))
        cells = []
        for s in sizes:
            o = ours_runs[-1][s]
            m = mpi_runs[-1][s] if mpi_runs else None
            cells.append(f"{human(s)} ours {o * 1e6:.2f} MPI {m * 1e6:.2f} ratio {o / m:.3f}" if m
                         else f"{human(s)} ours {o * 1e6:.2f}")
        print(f"run {k + 1} ({'ours' if first_ours else 'Open MPI'} first; load {before} -> {load()}): "
              + "; ".join(cells), flush=True)
    print(f"{'size':>8} | {'ours':>9} {'Open MPI':>9} | {'ours/MPI':>8} {'spread over runs':>18}")
    for s in sizes:
        o = statistics.median(r[s] for r in ours_runs)
        if mpi_runs:
            ratios = [a[s] / b[s] for a, b in zip(ours_runs, mpi_runs)]
            m = statistics.median(r[s] for r in mpi_runs)
            print(f"{human(s):>8} | {o * 1e6:9.2f} {m * 1e6:9.2f} | {statistics.median(ratios):8.3f} "
                  f"{min(ratios):8.3f} to {max(ratios):.3f}")
        else:
            print(f"{human(s):>8} | {o * 1e6:9.2f} {'-':>9} |")
