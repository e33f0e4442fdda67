"""Guard against slowdowns of the core: all_sum of two builds of this package, alternated in one session.

    .venv/bin/python benchmarks/compare.py BASE [HEAD] [--runs 5] [--scale 1] [--mode reuse]
        [--save benchmarks/results/compare_NAME.txt]

BASE and HEAD are git revisions of this repository (HEAD by default); `.` stands for this
checkout as installed in the running interpreter (uncommitted native changes included). Each
commit is built once into ~/.cache/mlx-jupyter-compare/<sha>/ (its files from `git archive`, a
venv that takes every dependency from the running one, `pip install --no-deps` of the package),
then reused. Each run launches, for each build in turn (the order flips every run), 2 ranks
timing 4 KiB, 1 MiB and 64 MiB, then 3 ranks timing 4 KiB, with our launcher
(`mlx-jupyter launch -n N --python BUILD`), as users start ranks. Each iteration is timed on
every rank and counts the slower rank; a build's figure per run is the median. Printed per
size: each build's median over the runs, and the time ratio HEAD/BASE per run (above 1: HEAD
slower) with its median and spread.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from allreduce import human, saved_output  # noqa: E402
from launcher_layout import launch_ranks  # noqa: E402

CACHE = Path(os.environ.get("MLX_JUPYTER_COMPARE_CACHE", Path.home() / ".cache" / "mlx-jupyter-compare"))
LAYOUTS = {"full": [(2, [4 << 10, 1 << 20, 64 << 20]), (3, [4 << 10])], "small": [(2, [4 << 10])],
           "large": [(2, [1 << 20, 64 << 20])]}


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def build(rev: str, rebuild: bool = False) -> tuple[str, str]:
    """(label, interpreter) of a build of `rev`; `.` is the running interpreter's install."""
    if rev == ".":
        return "this checkout", sys.executable
    sha = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    home = CACHE / sha
    python = home / "venv" / "bin" / "python"
    label = f"{rev} ({sha[:7]})" if not sha.startswith(rev) else sha[:7]
    if (home / "built").is_file() and not rebuild:
        _link_deps(python)   # the venv that made the build may be gone: dependencies come from ours
        return label, str(python)
    shutil.rmtree(home, ignore_errors=True)
    (home / "src").mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", sha], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(home / "src")], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(home / "venv")], check=True)
    _link_deps(python)
    isolation = ["--no-build-isolation"] if _has_build_tools() else []
    print(f"building {label} into {home} ...", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", *isolation, str(home / "src")], check=True)
    (home / "built").write_text(sha + "\n")
    return label, str(python)


def _link_deps(python: Path) -> None:
    """The running venv's packages come after the build's own: dependencies without a download."""
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "_compare_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")


def _has_build_tools() -> bool:
    try:
        import nanobind  # noqa: F401
        import scikit_build_core  # noqa: F401
    except ImportError:
        return False
    return True


def launch(python: str, n: int, sizes: list[int], scale: float, mode: str, timeout: float = 900) -> list[dict]:
    """Starts n local ranks of compare_rank.py with our launcher; returns what each rank wrote."""
    env = {"BENCH_SIZES": json.dumps(sizes), "BENCH_SCALE": str(scale), "BENCH_MODE": mode}
    return launch_ranks(n, env, HERE / "compare_rank.py", python=python, timeout=timeout)


def slower_rank_medians(per_rank: list[dict]) -> dict[int, float]:
    """Per size: the median over iterations of the slower rank's time."""
    sizes = per_rank[0]["times"]
    return {int(s): statistics.median(max(it) for it in zip(*(d["times"][s] for d in per_rank))) for s in sizes}


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", help="git revision measured against (e.g. main, 8b1aeae)")
    ap.add_argument("head", nargs="?", default="HEAD", help="git revision measured (default HEAD; `.` = this checkout)")
    ap.add_argument("--runs", type=int, default=5, help="alternations (each launches both builds)")
    ap.add_argument("--scale", type=float, default=1.0, help="iteration factor (0.05 for a smoke run)")
    ap.add_argument("--mode", default="reuse", choices=["reuse", "fresh", "poison"],
                    help="out=: one array reused (default), a new one each iteration, or filled before each")
    ap.add_argument("--layout", default="full", choices=list(LAYOUTS),
                    help="full (default); small: 4 KiB, 2 ranks; large: 1 and 64 MiB, 2 ranks")
    ap.add_argument("--rebuild", action="store_true", help="build the commits again")
    ap.add_argument("--save", metavar="FILE", help="also write the output to FILE")
    args = ap.parse_args()
    layout = LAYOUTS[args.layout]
    builds = [build(args.base, args.rebuild), build(args.head, args.rebuild)]
    with saved_output(args.save):
        print(f"$ {' '.join(['python', 'benchmarks/compare.py'] + sys.argv[1:])}")
        print(f"BASE {builds[0][0]}, HEAD {builds[1][0]}; {os.cpu_count()} cores; out= mode {args.mode}; "
              f"load average before: {load()}")
        figures: dict[tuple[int, int], list[list[float]]] = {}  # (ranks, size) -> per run [base, head]
        for run in range(args.runs):
            order = [0, 1] if run % 2 == 0 else [1, 0]
            got: dict[int, dict[tuple[int, int], float]] = {}
            for which in order:
                label, python = builds[which]
                for n, sizes in layout:
                    per_rank = launch(python, n, sizes, args.scale, args.mode)
                    _check_module(per_rank, python)
                    for size, t in slower_rank_medians(per_rank).items():
                        got.setdefault(which, {})[(n, size)] = t
            for key in got[0]:
                figures.setdefault(key, []).append([got[0][key], got[1][key]])
            print(f"run {run + 1}: " + "; ".join(f"{n}r {human(s)} {got[1][(n, s)] / got[0][(n, s)]:.3f}"
                                                for n, s in got[0]) + f"  (load {load()})", flush=True)
        print(f"\nall_sum float32, local ranks started by `mlx-jupyter launch`; slower rank per iteration, "
              f"median; {args.runs} alternated runs")
        print(f"{'ranks':>5} {'size':>7} | {'BASE':>10} {'HEAD':>10} | {'HEAD bus BW':>11} | "
              f"{'HEAD/BASE time':>14}  {'spread over runs':>16}")
        for (n, size), per_run in figures.items():
            base = statistics.median(r[0] for r in per_run)
            head = statistics.median(r[1] for r in per_run)
            ratios = [r[1] / r[0] for r in per_run]
            bw = size * 2 * (n - 1) / n / head / 1e9
            print(f"{n:>5} {human(size):>7} | {_fmt(base):>10} {_fmt(head):>10} | {bw:8.2f} GB/s | "
                  f"{statistics.median(ratios):14.3f}  {min(ratios):.3f} to {max(ratios):.3f}")
        print("bus bandwidth = bytes * 2(n-1)/n / time; BASE/HEAD bandwidths: "
              + "; ".join(f"{human(s)} {s * (n - 1) * 2 / n / statistics.median(r[0] for r in f) / 1e9:.2f}/"
                          f"{s * (n - 1) * 2 / n / statistics.median(r[1] for r in f) / 1e9:.2f} GB/s"
                          for (n, s), f in figures.items() if n == 2 and s >= 1 << 20))
        print(f"load average after: {load()}")
    return 0


def _fmt(t: float) -> str:
    return f"{t * 1e6:.2f} µs" if t < 1e-3 else f"{t * 1e3:.2f} ms"


def _check_module(per_rank: list[dict], python: str) -> None:
    """The ranks ran the build asked for, not this checkout."""
    home = str(Path(python).parent.parent.parent)
    if python != sys.executable and not all(d["module"].startswith(home) for d in per_rank):
        raise SystemExit(f"ranks imported {per_rank[0]['module']}, not the build in {home}")


if __name__ == "__main__":
    sys.exit(main())
