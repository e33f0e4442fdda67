"""Where a 2-rank cluster's ready time goes: ``Cluster(n=2).start()`` with each step timed, and
what the two imports taken off ``%mlx_cluster start``'s path cost in a fresh interpreter.

    .venv/bin/python benchmarks/ready_trace.py [--runs 5]

Per run: when the controller's connection files appeared, when the ranks were all registered
(the probe begins then), how long the start-up probe took, and the whole start. Then the
import time of ipywidgets (the progress widget the magic no longer builds) and of numpy (which
ipyparallel's serializer imports at the client's first request; we import it in the background
while the controller starts), each measured in a new process that has already imported what a
kernel with the extension loaded has (IPython, ipyparallel's client).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

from mlx_jupyter.cluster import Cluster

#: (part of the cluster, step): the probe begins once every rank is registered
STEPS = (("processes", "await_controller"), ("startup", "probe_channels"))

IMPORT_COST = """
import time, IPython, ipyparallel
t = time.perf_counter()
import {module}
print(time.perf_counter() - t)
"""


def timed_steps(cluster: Cluster, t0: float, marks: dict[str, tuple[float, float]]) -> None:
    """Wrap this cluster's start steps so that each records (start, end) relative to ``t0``."""
    for part_name, name in STEPS:
        part = getattr(cluster, part_name)
        step: Callable[..., Any] = getattr(part, name)

        def wrapped(*args: Any, _step: Callable[..., Any] = step, _name: str = name, **kwargs: Any) -> Any:
            begun = time.perf_counter() - t0
            try:
                return _step(*args, **kwargs)
            finally:
                marks[_name] = (begun, time.perf_counter() - t0)

        setattr(part, name, wrapped)


def one_start() -> dict[str, float]:
    c = Cluster(n=2)
    marks: dict[str, tuple[float, float]] = {}
    t0 = time.perf_counter()
    timed_steps(c, t0, marks)
    c.start()
    total = time.perf_counter() - t0
    c.stop()
    return {"controller's files": marks["await_controller"][1],
            "ranks registered": marks["probe_channels"][0],
            "probe": marks["probe_channels"][1] - marks["probe_channels"][0],
            "ready": total}


def import_cost(module: str, runs: int) -> float:
    times = [float(subprocess.run([sys.executable, "-c", IMPORT_COST.format(module=module)], check=True,
                                  capture_output=True, text=True).stdout) for _ in range(runs)]
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    runs = ap.parse_args().runs
    rows = [one_start() for _ in range(runs)]
    print(f"Cluster(n=2).start(), {runs} runs; seconds from the start call (median, range)")
    for key in rows[0]:
        vals = [r[key] for r in rows]
        print(f"  {key:20} {statistics.median(vals):.3f}  ({min(vals):.3f} to {max(vals):.3f})"
              + ("  (duration)" if key == "probe" else ""))
    print(f"import cost after IPython and ipyparallel, fresh process, median of {runs}:")
    for module in ("ipywidgets", "numpy"):
        print(f"  {module:20} {import_cost(module, runs):.3f} s")


if __name__ == "__main__":
    main()
