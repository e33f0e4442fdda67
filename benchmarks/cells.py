"""Cluster-ready time and cell round trips through a real kernel: %%mlx_distributed vs ipyparallel %%px.

One run, 2 local ranks: ``python benchmarks/cells.py [--cells N]``. Prints medians and ratios.
(jupyter-distributed is not measured: not installed here.)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.cluster.kernel import Kernel  # noqa: E402


def timed(k: Kernel, code: str, n: int) -> float:
    times = []
    for _ in range(n):
        res = k.run(code, 60)
        assert res.status == "ok", res
        times.append(res.elapsed)
    return statistics.median(times)


def ours(n: int) -> dict:
    k = Kernel()
    try:
        k.run("%load_ext mlx_jupyter", 30)
        t0 = time.monotonic()
        assert k.run("%mlx_cluster start -n 2", 60).status == "ok"
        ready = time.monotonic() - t0
        k.run("%%mlx_distributed\nimport numpy as np, mlx_jupyter.distributed as d", 60)
        out = {"ready": ready,
               "trivial": timed(k, "%%mlx_distributed\nx = 1", n),
               "all_sum (MLX)": timed(k, "%%mlx_distributed\nmx.eval(mx.distributed.all_sum(mx.ones(1024)))", n),
               "all_sum (ours)": timed(k, "%%mlx_distributed\nd.all_sum(np.ones(1024))", n)}
        k.run("%mlx_cluster stop", 30)
        return out
    finally:
        k.close()


def ipp_px(n: int) -> dict:
    k = Kernel()
    try:
        k.run("import ipyparallel as ipp", 30)
        t0 = time.monotonic()
        assert k.run("rc = ipp.Cluster(n=2, log_level=40).start_and_connect_sync(activate=True)", 90).status == "ok"
        ready = time.monotonic() - t0
        out = {"ready": ready, "trivial": timed(k, "%%px\nx = 1", n)}
        k.run("rc.cluster.stop_cluster_sync()", 30)
        return out
    finally:
        k.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=20)
    n = ap.parse_args().cells
    a, b = ours(n), ipp_px(n)
    print(f"{'':18} {'mlx_jupyter':>12} {'ipyparallel':>12} {'ratio':>7}")
    for key in ("ready", "trivial", "all_sum (MLX)", "all_sum (ours)"):
        mine, theirs = a.get(key), b.get(key)
        ratio = f"{theirs / mine:6.1f}x" if mine and theirs else "    n/a"
        fmt = lambda v: f"{v * 1000:9.1f} ms" if v is not None else "       n/a"  # noqa: E731
        print(f"{key:18} {fmt(mine):>12} {fmt(theirs):>12} {ratio}")


if __name__ == "__main__":
    main()
