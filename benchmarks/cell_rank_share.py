"""What the ranks' own execution costs a trivial distributed cell: in one kernel with 2 local ranks,
alternating blocks of ``%%mlx_distributed`` ``x = 1`` run as usual and with the ranks answering at
once (their cell channel patched to reply without running the cell), beside a plain ``x = 1`` cell.

    .venv/bin/python benchmarks/cell_rank_share.py [--rounds 10] [--cells 15] [--save benchmarks/results/cell_rank_share.txt]

The patch is this benchmark's only: it replaces ``RankChannel._run`` on the ranks for ``x = 1`` alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from allreduce import header, saved_output  # noqa: E402
from cell_ab import alternate  # noqa: E402
from guard import must, new_kernel, stop  # noqa: E402

TRIVIAL = "%%mlx_distributed\nx = 1"
PATCH = """%%mlx_distributed
from mlx_jupyter.cluster.rank import channel as _bench_channel
_bench_ch = _bench_channel.CHANNEL
_bench_ch._bench_run = _bench_ch._run
async def _bench_at_once(request, code, _ch=_bench_ch):
    if code.strip() == "x = 1":
        return {"status": "ok", "execution_count": 1, "user_expressions": {}, "payload": []}
    return await _ch._bench_run(request, code)
"""
MODES = {"at once": "%%mlx_distributed\n_bench_ch._run = _bench_at_once",
         "as usual": "%%mlx_distributed\n_bench_ch._run = _bench_ch._bench_run"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10, help="blocks of each mode, alternating")
    ap.add_argument("--cells", type=int, default=15, help="trivial cells per block")
    ap.add_argument("--save", help="also write the whole output here (e.g. benchmarks/results/cell_rank_share.txt)")
    args = ap.parse_args()
    with saved_output(args.save):
        print("\n".join(header()))
        run(args)


def run(args: argparse.Namespace) -> None:
    """The alternating blocks, then the medians."""
    k = new_kernel()
    plain: list[float] = []
    try:
        must(k, "%mlx_cluster start -n 2", 120)
        must(k, PATCH)
        for _ in range(10):
            must(k, TRIVIAL)
        blocks = alternate(k, MODES, TRIVIAL, args.rounds, args.cells,
                           between=lambda: plain.extend(must(k, "x = 1") for _ in range(args.cells // 2 or 1)))
    finally:
        stop(k)
    times = {"plain cell (x = 1)": plain, "ranks answer at once": blocks["at once"],
             "ranks run the cell": blocks["as usual"]}
    for name, values in times.items():
        print(f"{name:24} {statistics.median(values) * 1000:7.2f} ms  (n={len(values)})")


if __name__ == "__main__":
    main()
