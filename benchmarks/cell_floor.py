"""The kernel's own floor under a distributed cell: in one kernel with 2 local ranks, alternating rounds of
a plain ``x = 1`` cell, ``%%time`` (a local cell magic) and ``%%mlx_distributed`` ``x = 1``; medians.

    .venv/bin/python benchmarks/cell_floor.py [--rounds 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from guard import alternate, must, new_kernel, stop  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40, help="cells of each kind (after 5 warm-up cells)")
    args = ap.parse_args()
    k = new_kernel()
    try:
        must(k, "%mlx_cluster start -n 2", 120)
        times = alternate({"plain cell (x = 1)": (k, "x = 1"), "%%time cell": (k, "%%time\nx = 1"),
                           "%%mlx_distributed cell (x = 1)": (k, "%%mlx_distributed\nx = 1")}, args.rounds)
    finally:
        stop(k)
    for name, values in times.items():
        print(f"{name:32} {statistics.median(values) * 1000:7.2f} ms")


if __name__ == "__main__":
    main()
