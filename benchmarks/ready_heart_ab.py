"""Cluster ready time, 2 local ranks (``Cluster(n=2).start()``), with the ranks' heart started
when the hub's registration reply arrives (ours) and after the kernel is built (ipyparallel's
order, as before), interleaved run by run.

    .venv/bin/python benchmarks/ready_heart_ab.py [--runs 8]

Prints, per variant, the median ready time, the median times from the controller's connection
files to both ranks listed by the hub and to both answering the start-up probe (less noisy than
the ready time: the controller's own start is left out), and the median CPU seconds each process had used at ready
(psutil; the load-independent part: the change moves a wait, not work). ``Cluster.ready_time`` is
measured inside ``start``; ``%mlx_cluster start`` adds the magic's few milliseconds
(benchmarks/cells.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import psutil

from mlx_jupyter.cluster.handle import Cluster
from mlx_jupyter.cluster.processes import process_tree

#: the ranks' engine with the early heart turned off (ipyparallel starts it after the kernel build)
HEART_LATE = [sys.executable, "-c", "from mlx_jupyter.cluster.rank import engine\n"
              "engine.MLXEngine._beat_early = lambda *a: None\nengine.main()"]


class _Timed(Cluster):
    """Cluster noting when the controller's files appeared and when every rank was listed."""

    marks: dict[str, float]

    def _await_controller(self, timeout: float = 30.0) -> None:
        super()._await_controller(timeout)
        self.marks["files"] = time.perf_counter()

    def _probe_channels(self, deadline: float, *args, **kwargs) -> None:
        self.marks["listed"] = time.perf_counter()
        super()._probe_channels(deadline, *args, **kwargs)
        self.marks["answered"] = time.perf_counter()


class _HeartLate(_Timed):
    def _config(self):
        cfg = super()._config()
        cfg.MLXEngineSetLauncher.engine_cmd = list(HEART_LATE)
        return cfg


def cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def run(cls: type) -> dict[str, float]:
    c = cls(n=2)
    c.marks = {}
    cpu0 = time.process_time()
    try:
        c.start()
        out = {"ready": c.ready_time or 0.0, "files->listed": c.marks["listed"] - c.marks["files"],
               "files->answered": c.marks["answered"] - c.marks["files"],
               "cpu kernel": time.process_time() - cpu0, "cpu controller": cpu(process_tree(c.ipp.controller.pid))}
        for info in c.engine_set.launcher.ranks:
            out[f"cpu rank {info.rank}"] = cpu(process_tree(info.pid))
        return out
    finally:
        c.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8)
    runs = ap.parse_args().runs
    variants = {"heart at registration (ours)": _Timed, "heart after kernel build": _HeartLate}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    run(_Timed)  # not counted: this process's first start also imports the cluster's modules
    for i in range(runs):
        order = list(variants.items())
        for name, cls in order if i % 2 else order[::-1]:
            results[name].append(run(cls))
    for name, rs in results.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        each = " ".join(f"{r['ready']:.2f}" for r in rs)
        print(f"{name:29} ready median {med['ready']:.3f} s (runs {each})")
        print(f"{'':29} from the controller's files: ranks listed {med['files->listed']:.3f} s, answering "
              f"{med['files->answered']:.3f} s (medians)")
        print(f"{'':29} CPU s at ready, median: "
              + ", ".join(f"{k[4:]} {v:.3f}" for k, v in med.items() if k.startswith("cpu")))
    best = statistics.median(r["ready"] for r in results["heart at registration (ours)"])
    print(f"target: ready within 1.0 s (2 local ranks): {'MET' if best <= 1.0 else 'MISSED'} ({best:.3f} s)")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
