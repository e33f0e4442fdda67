"""Cluster scale: ready time and trivial-cell round trip at 2, 4, 8 and 16 local ranks, ours
(``%mlx_cluster start -n N`` then ``%%mlx_distributed``) against ipyparallel (``ipp.Cluster(n=N)``
then ``%%px``), both through a real kernel, in one run.

    .venv/bin/python benchmarks/cells_scale.py [--ranks 2,4,8,16] [--cells 20]

Ready: from the start call to every rank answering (ours: start returns when every rank's
engine is registered; ipyparallel: ``start_and_connect_sync`` waits for n engines). Ours also
gets a first cell (binds ``world``/``group``, waits for MLX's ring) reported on its own line.
On a 2-core machine 8 and 16 ranks are oversubscribed. Targets: ours grows no faster than
ipyparallel's from the smallest to the largest count (ready and trivial cell), and the trivial
cell at 16 ranks stays under 50 ms. Growth is the time added from the smallest to the
largest count (the relative growth is printed beside it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.cluster.kernel import Kernel  # noqa: E402



def ours(ranks: int, cells: int) -> dict:
    k = Kernel()
    try:
        assert k.run("%load_ext mlx_jupyter", 30).status == "ok"
        t0 = time.monotonic()
        res = k.run(f"%mlx_cluster start -n {ranks}", 180)
        assert res.status == "ok", res
        ready = time.monotonic() - t0
        first = k.run("%%mlx_distributed\nx = 0", 180)
        assert first.status == "ok", first
        out = {"ready": ready, "first cell": first.elapsed,
               "trivial": k.median_elapsed("%%mlx_distributed\nx = 1", cells, 120)}
        k.run("%mlx_cluster stop", 60)
        return out
    finally:
        k.close()


def ipp_px(ranks: int, cells: int) -> dict:
    k = Kernel()
    try:
        assert k.run("import ipyparallel as ipp", 30).status == "ok"
        t0 = time.monotonic()
        res = k.run(f"rc = ipp.Cluster(n={ranks}, log_level=40).start_and_connect_sync(activate=True)", 180)
        assert res.status == "ok", res
        ready = time.monotonic() - t0
        out = {"ready": ready, "trivial": k.median_elapsed("%%px\nx = 1", cells, 120)}
        k.run("rc.cluster.stop_cluster_sync()", 60)
        return out
    finally:
        k.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4,8,16")
    ap.add_argument("--cells", type=int, default=20)
    args = ap.parse_args()
    counts = [int(x) for x in args.ranks.split(",")]
    rows = {}
    for n in counts:
        rows[n] = (ours(n, args.cells), ipp_px(n, args.cells))
        print(f"(done {n} ranks)", file=sys.stderr, flush=True)
    print(f"local ranks on {os.cpu_count()} cores (more ranks than cores: oversubscribed); "
          f"medians of {args.cells} cells; ratio = ipyparallel / ours (above 1: we are faster)")
    print(f"{'ranks':>5} | {'ready ours':>10} {'ipp':>8} {'ratio':>6} | {'1st cell':>8} | "
          f"{'trivial ours':>12} {'ipp %%px':>9} {'ratio':>6}")
    for n, (a, b) in rows.items():
        print(f"{n:>5} | {a['ready']:9.2f}s {b['ready']:7.2f}s {b['ready'] / a['ready']:5.2f}x | "
              f"{a['first cell'] * 1000:6.0f}ms | {a['trivial'] * 1000:10.1f}ms {b['trivial'] * 1000:7.1f}ms "
              f"{b['trivial'] / a['trivial']:5.2f}x")
    lo, hi = counts[0], counts[-1]
    print("\ntargets:")
    for key in ("ready", "trivial"):
        # growth = time added from the smallest to the largest count; ipyparallel's large fixed
        # start cost makes its relative growth small, so the relative figure is printed beside it
        (o_lo, i_lo), (o_hi, i_hi) = [(rows[c][0][key], rows[c][1][key]) for c in (lo, hi)]
        verdict = "MET" if o_hi - o_lo <= i_hi - i_lo else "MISSED"
        unit, k = ("s", 1) if key == "ready" else ("ms", 1000)
        print(f"  {verdict:12} {key} grows no faster than ipyparallel's ({lo} -> {hi} ranks): "
              f"ours +{(o_hi - o_lo) * k:.2f} {unit} (x{o_hi / o_lo:.2f}), "
              f"ipyparallel +{(i_hi - i_lo) * k:.2f} {unit} (x{i_hi / i_lo:.2f})")
    if 16 in rows:
        t = rows[16][0]["trivial"]
        print(f"  {'MET' if t < 0.05 else 'MISSED':12} trivial cell at 16 ranks under 50 ms: {t * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
