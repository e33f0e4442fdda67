"""Cluster ready time, 2 local ranks (``Cluster(n=2).start()``), with our controller as it is
(numpy not imported) and with numpy imported first (as it was before), interleaved run by run.

    .venv/bin/python benchmarks/ready_numpy_ab.py [--runs 8]

Prints both medians and the target (ready within 1.0 s). ``Cluster.ready_time`` is measured
inside ``start``; ``%mlx_cluster start`` adds the magic's few milliseconds (benchmarks/cells.py).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from mlx_jupyter.cluster.handle import Cluster

#: the controller command with numpy imported before ours runs (numpy is then not skipped)
WITH_NUMPY = [sys.executable, "-c", "import numpy, runpy; "
              "runpy.run_module('mlx_jupyter.cluster.controller', run_name='__main__', alter_sys=True)"]


class _NumpyController(Cluster):
    def _config(self):
        cfg = super()._config()
        cfg.LocalControllerLauncher.controller_cmd = list(WITH_NUMPY)
        return cfg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    runs = ap.parse_args().runs
    times: dict[str, list[float]] = {"controller without numpy (ours)": [], "controller with numpy": []}
    for _ in range(runs):
        for name, cls in (("controller with numpy", _NumpyController), ("controller without numpy (ours)", Cluster)):
            c = cls(n=2)
            try:
                c.start()
                assert c.ready_time is not None
                times[name].append(c.ready_time)
            finally:
                c.stop()
    for name, v in times.items():
        print(f"{name:32} median {statistics.median(v):.3f} s   runs {' '.join(f'{x:.2f}' for x in v)}")
    best = statistics.median(times["controller without numpy (ours)"])
    print(f"target: ready within 1.0 s (2 local ranks): {'MET' if best <= 1.0 else 'MISSED'} ({best:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
