"""Speed guard of the everyday path: ours against a reference measured in the same run, as ratios
(never absolute times), each failed above a limit (guard_verdict.LIMITS). `.ci/run` runs it once,
after the tests; exit status 1 when a row fails.

    .venv/bin/python benchmarks/guard.py [--rounds 30] [--starts 3] [--core-runs 5]
        [--only cells,start,core] [--save benchmarks/results/speed_guard.txt]
        [--versus NAME=PYTHON ...] [--allow-missing]

Rows (samples alternate between the two sides, the order flipping each round; medians):
- a trivial cell (`x = 1`, 2 local ranks) against ipyparallel's `%%px` on 2 engines, both
  clusters in one real kernel;
- an MLX `all_sum` cell (1M float32) against the same `all_sum` timed inside the ranks (the
  slower rank per cell): the notebook's overhead on a cell that does something;
- the cold start of 2 ranks (`%mlx_cluster start -n 2`) against ipyparallel's
  (`ipp.Cluster(n=2).start_and_connect_sync()`), each sample in a fresh kernel that has imported
  both packages first;
- our core's `all_sum` at 4 KiB and 64 MiB, ranks started by `mlx-jupyter launch`, against Open
  MPI's (mpi4py, ranks started by mpirun): allreduce.py's launcher layout.

The table is printed at the end and written to test-artifacts/speed-guard.txt (and to --save).
`--versus NAME=PYTHON` also times, alternately with the trivial cell, the same cell in a kernel
of another build's interpreter (a venv of a worktree at another commit): shown, not checked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]
from allreduce import mpirun_command, saved_output  # noqa: E402
from guard_verdict import Row, failed, table  # noqa: E402
from launcher_layout import load, run_mpi, run_ours, slower_rank_medians  # noqa: E402
from tests.cluster.kernel import Kernel  # noqa: E402

ARTIFACT = ROOT / "test-artifacts" / "speed-guard.txt"
TRIVIAL = "%%mlx_distributed\nx = 1"
PX_TRIVIAL = "%%px\nx = 1"
IPP_START = "rc = ipp.Cluster(n=2, log_level=40).start_and_connect_sync(activate=True)"
ALL_SUM_SETUP = "%%mlx_distributed\nimport time\n_x = mx.ones(1 << 20)\nmx.eval(_x)\n_inside = []"
ALL_SUM = ("%%mlx_distributed\n_t0 = time.perf_counter()\nmx.eval(mx.distributed.all_sum(_x))\n"
           "_inside.append(time.perf_counter() - _t0)")
PULL_INSIDE = "import json\nprint(json.dumps(__import__('mlx_jupyter.magics').magics._cluster.pull('_inside')))"


def kernel_specs(pythons: dict[str, str], folder: str) -> None:
    """A kernel spec per interpreter, found through JUPYTER_PATH (named as the keys)."""
    for name, python in pythons.items():
        spec = Path(folder, "kernels", name)
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": name, "language": "python"}))
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [folder, os.environ.get("JUPYTER_PATH")]))


def must(k: Kernel, code: str, timeout: float = 90) -> float:
    """Run ``code`` (it must succeed); its round trip in seconds."""
    res = k.run(code, timeout)
    if res.status != "ok":
        raise SystemExit(f"guard: {code.splitlines()[0]!r} failed:\n{res.stdout}{res.stderr}{res.traceback}")
    return res.elapsed


def alternate(codes: dict[str, tuple[Kernel, str]], rounds: int, warm: int = 5) -> dict[str, list[float]]:
    """Each cell ``rounds`` times, one of each per round, the order flipping every round."""
    names = list(codes)
    for name in names:
        for _ in range(warm):
            must(*codes[name])
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(rounds):
        for name in names if i % 2 == 0 else names[::-1]:
            times[name].append(must(*codes[name]))
    return times


def new_kernel(name: str = "python3") -> Kernel:
    k = Kernel(kernel_name=name, startup_timeout=60)
    must(k, "%load_ext mlx_jupyter\nimport ipyparallel as ipp", 60)
    return k


def starts(k: Kernel, ours_first: bool) -> tuple[float, float]:
    """Cold starts in fresh kernel ``k``: (ours, ipyparallel's), in the order given; both stay up."""
    got = {}
    for which in ("ours", "ipp") if ours_first else ("ipp", "ours"):
        got[which] = must(k, "%mlx_cluster start -n 2" if which == "ours" else IPP_START, 120)
    return got["ours"], got["ipp"]


def stop(k: Kernel) -> None:
    try:
        k.run("%mlx_cluster stop\ntry:\n    rc.cluster.stop_cluster_sync()\nexcept NameError:\n    pass", 60)
    finally:
        k.close()


def cells_and_starts(args: argparse.Namespace, rows: dict[str, Row]) -> None:
    """The start row over ``--starts`` fresh kernels; the last one's clusters then time the cells."""
    kernels: list[Kernel] = []  # the ones still up
    try:
        for i in range(args.starts):
            while kernels:
                stop(kernels.pop())
            kernels.append(new_kernel())
            ours, theirs = starts(kernels[0], ours_first=i % 2 == 0)
            rows["start"].ours.append(ours)
            rows["start"].theirs.append(theirs)
            print(f"start {i + 1}: ours {ours:.2f} s, ipyparallel {theirs:.2f} s (load {load()})", flush=True)
        if "cells" not in args.only:
            return
        k = kernels[0]
        codes = {"ours": (k, TRIVIAL), "px": (k, PX_TRIVIAL)}
        for name, _ in args.versus:
            kernels.append(new_kernel(name))
            must(kernels[-1], "%mlx_cluster start -n 2", 120)
            codes[name] = (kernels[-1], TRIVIAL)
        times = alternate(codes, args.rounds)
        rows["cell"].ours, rows["cell"].theirs = times["ours"], times["px"]
        for name, _ in args.versus:
            rows[f"versus {name}"] = Row(f"versus {name}", "trivial cell", f"the same cell on {name}",
                                         times["ours"], times[name])
        all_sum_cell(k, args.rounds, rows["all_sum_cell"])
    finally:
        while kernels:
            stop(kernels.pop())


def all_sum_cell(k: Kernel, n: int, row: Row) -> None:
    """The MLX all_sum cell's round trips against the slower rank's own timing of its all_sum."""
    must(k, ALL_SUM_SETUP)
    for _ in range(3):
        must(k, ALL_SUM)
    must(k, "%%mlx_distributed\n_inside.clear()")
    row.ours = [must(k, ALL_SUM) for _ in range(n)]
    res = k.run(PULL_INSIDE, 60)
    if res.status != "ok":
        raise SystemExit(f"guard: could not read the ranks' own all_sum times:\n{res.traceback}")
    per_rank = json.loads(res.stdout)
    row.theirs = [max(t) for t in zip(*per_rank)]


def core(args: argparse.Namespace, rows: dict[str, Row]) -> None:
    """allreduce.py's launcher layout at 4 KiB and 64 MiB, ``--core-runs`` alternated runs."""
    sizes = {"core_4k": 4 << 10, "core_64m": 64 << 20}
    mpirun = mpirun_command(2)
    if mpirun is None:
        for key in sizes:
            rows[key].missing = ("needs Open MPI's mpirun and mpi4py: apt-get install openmpi-bin "
                                 "libopenmpi-dev; .venv/bin/pip install '.[bench]'")
        return
    for i in range(args.core_runs):
        for which in ("ours", "mpi") if i % 2 == 0 else ("mpi", "ours"):
            got = slower_rank_medians(run_ours(2, list(sizes.values()), 1.0) if which == "ours"
                                      else run_mpi(mpirun, 2, list(sizes.values()), 1.0))
            for key, size in sizes.items():
                (rows[key].ours if which == "ours" else rows[key].theirs).append(got[size])
        print(f"core run {i + 1}: " + "; ".join(
            f"{key} ours {rows[key].ours[-1] * 1e6:.1f} us, Open MPI {rows[key].theirs[-1] * 1e6:.1f} us"
            for key in sizes) + f" (load {load()})", flush=True)


def make_rows() -> dict[str, Row]:
    return {
        "cell": Row("cell", "trivial cell (x = 1, 2 ranks)", "ipyparallel %%px"),
        "all_sum_cell": Row("all_sum_cell", "MLX all_sum cell (1M float32)", "all_sum inside the ranks"),
        "start": Row("start", "cold start of 2 ranks", "ipyparallel's"),
        "core_4k": Row("core_4k", "core all_sum 4 KiB", "Open MPI"),
        "core_64m": Row("core_64m", "core all_sum 64 MiB", "Open MPI"),
    }


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30, help="cells per side (after 5 warm-up cells)")
    ap.add_argument("--starts", type=int, default=3, help="cold starts per side, each in a fresh kernel")
    ap.add_argument("--core-runs", type=int, default=5, help="alternated launches per side for the core rows (5: one 4 KiB launch varies 1.5-4 us here)")
    ap.add_argument("--only", default="cells,start,core", help="comma-separated: cells, start, core")
    ap.add_argument("--save", help="also write the whole output here (e.g. benchmarks/results/speed_guard.txt)")
    ap.add_argument("--versus", action="append", default=[], metavar="NAME=PYTHON",
                    help="also time the trivial cell in a kernel of this interpreter (shown, not checked)")
    ap.add_argument("--allow-missing", action="store_true", help="a reference that cannot run does not fail")
    args = ap.parse_args(argv)
    args.only = set(args.only.split(","))
    args.versus = [tuple(v.split("=", 1)) for v in args.versus]
    if args.versus:
        args.only.add("cells")
    t0 = time.monotonic()
    rows = make_rows()
    with tempfile.TemporaryDirectory(prefix="guard-kernels-") as specs, saved_output(args.save):
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} $ {' '.join(sys.argv)}")
        print(f"speed guard: {os.cpu_count()} CPUs, load {load()}, python {sys.executable}", flush=True)
        kernel_specs({"python3": sys.executable, **dict(args.versus)}, specs)
        if args.only & {"cells", "start"}:
            if "start" not in args.only:
                args.starts = 1
            cells_and_starts(args, rows)
            if "start" not in args.only:
                rows["start"].ours, rows["start"].theirs = [], []
        if "core" in args.only:
            core(args, rows)
        shown = [r for r in rows.values() if r.ours or r.theirs or r.missing]
        text = table(shown)
        bad = failed(shown, args.allow_missing)
        verdict = ("speed guard FAILED: " + ", ".join(r.what for r in bad)) if bad else "speed guard passed"
        print(f"\n{text}\nratio = median(ours) / median(reference); the limit is on the ratio\n"
              f"{verdict} ({time.monotonic() - t0:.0f} s, load {load()})")
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(f"{text}\n{verdict}\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
