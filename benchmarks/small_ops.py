"""Small collectives at 3+ local ranks: our core through the board, our core over the ring
(the same ranks, a split of the group with the board turned off), and Open MPI (mpi4py), in the
same rank processes started by mpirun.

Ops: all_gather and all_sum of float32 vectors of 64 B to 16 KiB per rank (the board's
limit), and barrier. Timing as in allreduce.py (rank_timing.py): alternating blocks, every
iteration timed on every rank, the slower rank's time per iteration, the median of those;
every result checked.

    .venv/bin/python benchmarks/small_ops.py [--ranks 3,4] [--quick] [--save benchmarks/results/small_ops.txt]
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from allreduce import header, human, launch, ratio, saved_output, slower_rank_median

SIZES = [64, 1024, 4096, 16384]
COLUMNS = ["board", "ring", "mpi"]

RANK_CODE = r"""
from mlx_jupyter import distributed as dist

g = dist.init(strict=True, backend="ring", timeout=60)
n = g.size()
g.barrier()  # the first small op: g joins the board (its ranks share this host)
no_board = g.options
no_board.board = False
ring = g.split(0, options=no_board)  # the same ranks in the same order, deciding without the board
ring.barrier()
assert "board:shm" in g.link_kinds() and "board:shm" not in ring.link_kinds(), (g.link_kinds(), ring.link_kinds())

times = {}
def keep(op, results, nbytes):
    for col, t in results.items():
        times.setdefault(f"{op}/{col}", {})[nbytes] = t

for nbytes in sizes:
    x = np.full(nbytes // 4, RANK + 1, np.float32)
    gathered = np.repeat(np.arange(1, n + 1, dtype=np.float32), x.size)
    summed = np.full_like(x, n * (n + 1) / 2)
    for op, want, mine, mpi_call in (("all_gather", gathered, dist.all_gather, "Allgather"),
                                     ("all_sum", summed, dist.all_sum, "Allreduce")):
        runners = {}
        for col, grp in (("board", g), ("ring", ring)):
            out = np.empty_like(want)
            runners[col] = (lambda grp=grp, out=out: mine(x, group=grp, out=out), checker(want, f"{op} {col}", RANK),
                            g.barrier, lambda out=out: out.fill(-1))
        if USE_MPI:
            out_mpi = np.empty_like(want)
            f = getattr(comm, mpi_call)
            runners["mpi"] = (lambda f=f, out=out_mpi: (f(x, out), out)[1], checker(want, f"{op} Open MPI", RANK),
                              comm.Barrier, lambda out=out_mpi: out.fill(-1))
        keep(op, measure(runners, nbytes, scale), nbytes)
no_check = lambda _: None
runners = {"board": (g.barrier, no_check, g.barrier, lambda: None),
           "ring": (ring.barrier, no_check, g.barrier, lambda: None)}
if USE_MPI:
    runners["mpi"] = (comm.Barrier, no_check, comm.Barrier, lambda: None)
keep("barrier", measure(runners, 0, scale), 0)
with open(os.path.join(os.environ["BENCH_OUT"], f"rank-{RANK}.json"), "w") as fh:
    json.dump({"times": times}, fh)
"""


def cell(t: float | None) -> str:
    return f"{t * 1e6:9.1f}" if t else f"{'-':>9}"


def table(n: int, per_rank: list[dict]) -> None:
    print(f"\n{n} local ranks; slower rank's time per iteration, median, in µs")
    print(f"{'op':>10} {'size':>7} | {'board':>9} {'ring':>9} {'MPI':>9} | {'board/ring':>10} {'board/MPI':>9}")
    for op in ("all_gather", "all_sum", "barrier"):
        cols = {c: slower_rank_median(per_rank, f"{op}/{c}") if f"{op}/{c}" in per_rank[0]["times"] else None
                for c in COLUMNS}
        for size in cols["board"]:
            b, r, m = (cols[c][size] if cols[c] else None for c in COLUMNS)
            label = "-" if op == "barrier" else (f"{size} B" if size < 1024 else human(size))
            print(f"{op:>10} {label:>7} | {cell(b)} {cell(r)} {cell(m)} | {ratio(b, r):>10} {ratio(b, m):>9}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="3,4", help="comma-separated world sizes, each at least 3 (default 3,4)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: a tenth of the iterations (noisy figures)")
    ap.add_argument("--save", metavar="FILE", help="also write the output to FILE")
    args = ap.parse_args()
    counts = [int(x) for x in args.ranks.split(",")]
    if min(counts) < 3:
        ap.error("--ranks: the board forms from 3 ranks on (2 ranks always take one step)")
    with saved_output(args.save):
        print("\n".join(header()))
        for n in counts:
            with tempfile.TemporaryDirectory() as out_dir:
                per_rank, by_mpirun = launch(n, RANK_CODE, {"BENCH_SIZES": str(SIZES),
                                                            "BENCH_SCALE": "0.1" if args.quick else "1"},
                                             "auto", out_dir)
            table(n, per_rank)
            if not by_mpirun:
                print("(Open MPI column empty: install openmpi-bin and libopenmpi-dev, then `.venv/bin/pip install mpi4py`)")
        print("\nratios: board's time / the other's (below 1: the board is faster); "
              "every result was checked on every rank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
