"""Timing inside each benchmark rank (imported by the ranks of allreduce.py and small_ops.py).

Libraries are timed in alternating blocks, so a change of the machine's state during the
run (on this VM, core-to-core latency doubles for minutes at a time) reaches every column
alike; every iteration is timed, and every result checked outside the timed call."""

from __future__ import annotations

import json
import os
import time
from typing import Any, Callable

import numpy as np

ROUNDS = 10  # blocks per library and size
clock = time.perf_counter

#: name -> (call, check, barrier, prepare)
Runner = tuple[Callable[[], Any], Callable[[Any], None], Callable[[], Any], Callable[[], Any]]


def rank_setup() -> tuple[Any, int, list[int], float]:
    """(the MPI communicator or None, this rank, the sizes, the iteration scale) from the
    launcher's environment. Under mpirun, MPI comes first and gives MLX_RANK."""
    comm = None
    if os.environ.get("BENCH_MPI") == "1":
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        os.environ["MLX_RANK"] = str(comm.rank)  # mpirun sets only its own rank variables
    sizes = json.loads(os.environ["BENCH_SIZES"])
    return comm, int(os.environ["MLX_RANK"]), sizes, float(os.environ.get("BENCH_SCALE", "1"))


def iterations(nbytes: int, scale: float) -> int:
    """Iterations for a message of nbytes: many for small ones, a few for 64 MiB."""
    return max(3, int(scale * max(5, min(2000, int(4e8 // max(nbytes, 1))))))


def measure(runners: dict[str, Runner], nbytes: int, scale: float) -> dict[str, list[float]]:
    """Every iteration's time per runner, after a warm-up (caches, pages, connections)."""
    n = iterations(nbytes, scale)
    rounds = min(ROUNDS, n)
    per = -(-n // rounds)
    for call, check, barrier, prepare in runners.values():
        for _ in range(max(3, n // 5)):
            prepare()
            check(call())
    times: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    for k in range(rounds):
        for name in order if k % 2 == 0 else order[::-1]:
            call, check, barrier, prepare = runners[name]
            barrier()
            for _ in range(per):
                prepare()  # e.g. poison out=, so that a stale result cannot pass the check
                t0 = clock()
                r = call()
                times[name].append(clock() - t0)
                check(r)
    return times


def checker(want: Any, what: str, rank: int) -> Callable[[Any], None]:
    """A check that the result equals `want`; a wrong one ends the run naming `what`."""
    def check(got: Any) -> None:
        if not np.array_equal(np.asarray(got), want):
            raise SystemExit(f"{what}: wrong result on rank {rank}")
    return check
