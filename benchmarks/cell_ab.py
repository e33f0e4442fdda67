"""An A/B of one change to a trivial distributed cell's path, in one kernel: blocks of cells with the
change on and off, alternating, so that a machine whose load drifts weighs on both sides alike.

    .venv/bin/python benchmarks/cell_ab.py --setup CODE --on CODE --off CODE [--rounds 10] [--cells 15]

``--setup`` runs once in the kernel after the cluster started (e.g. keep the original function);
``--on``/``--off`` switch the change (kernel code; ``%%mlx_distributed`` cells reach the ranks).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Callable, Optional

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from allreduce import header, saved_output  # noqa: E402
from guard import must, new_kernel, stop  # noqa: E402
from tests.cluster.kernel import Kernel  # noqa: E402

TRIVIAL = "%%mlx_distributed\nx = 1"


def alternate(k: Kernel, switches: dict[str, str], code: str, rounds: int, cells: int,
              between: Optional[Callable[[], None]] = None) -> dict[str, list[float]]:
    """``cells`` timed runs of ``code`` after each switch (kernel code) of ``switches``, in blocks
    whose order flips every round; ``between()`` after each round. Each side's round trips in seconds."""
    times: dict[str, list[float]] = {name: [] for name in switches}
    names = list(switches)
    for i in range(rounds):
        for name in names if i % 2 == 0 else names[::-1]:
            must(k, switches[name])
            must(k, code)  # the first cell after a switch is not timed
            times[name] += [must(k, code) for _ in range(cells)]
        if between is not None:
            between()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", default="", help="kernel code run once after the cluster started")
    ap.add_argument("--on", required=True, help="kernel code that switches the change on")
    ap.add_argument("--off", required=True, help="kernel code that switches it off")
    ap.add_argument("--code", default=TRIVIAL, help="the cell timed")
    ap.add_argument("--rounds", type=int, default=10, help="blocks of each side, alternating")
    ap.add_argument("--cells", type=int, default=15, help="cells per block")
    ap.add_argument("--save", help="also write the whole output here")
    args = ap.parse_args()
    with saved_output(args.save):
        print("\n".join(header()))
        k = new_kernel()
        try:
            must(k, "%mlx_cluster start -n 2", 120)
            if args.setup:
                must(k, args.setup)
            for _ in range(10):
                must(k, args.code)
            times = alternate(k, {"on": args.on, "off": args.off}, args.code, args.rounds, args.cells)
        finally:
            stop(k)
        on, off = (statistics.median(times[s]) * 1000 for s in ("on", "off"))
        print(f"change on  {on:7.2f} ms\nchange off {off:7.2f} ms\nratio on/off {on / off:.3f}  "
              f"(n={len(times['on'])} a side)")


if __name__ == "__main__":
    main()
