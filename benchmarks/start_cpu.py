"""CPU a cluster's start costs per rank, ours against ipyparallel's, through a real kernel.

``python benchmarks/start_cpu.py [--ranks 16]``: starts N local ranks with
``%mlx_cluster start -n N``, then with ``ipp.Cluster(n=N).start_and_connect_sync()``, and
prints the ready time and the CPU (user + system) the rank processes had used when start
returned, per rank, beside the kernel's and the controller's. On a machine with fewer cores
than ranks the ready time is bounded below by the total CPU over the cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.cluster.kernel import Kernel  # noqa: E402


def cpu(p: psutil.Process) -> float:
    try:
        t = p.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


def measure(label: str, start: str, stop: str, n: int) -> None:
    k = Kernel()
    try:
        t0 = time.monotonic()
        assert k.run(start, 300).status == "ok"
        ready = time.monotonic() - t0
        kernel = psutil.Process(k.pid)
        procs = kernel.children(recursive=True)
        controller = [p for p in procs if "controller" in " ".join(p.cmdline())]
        ranks = [p for p in procs if p not in controller]
        total = sum(map(cpu, ranks))
        print(f"{label:>12}: ready {ready:5.2f} s; rank processes {total:5.2f} s CPU = {total / n:.3f} s per rank; "
              f"kernel {cpu(kernel):.2f} s, controller {sum(map(cpu, controller)):.2f} s; "
              f"all / {os.cpu_count()} cores = {(total + cpu(kernel) + sum(map(cpu, controller))) / os.cpu_count():.2f} s")
        k.run(stop, 60)
    finally:
        k.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=16)
    n = ap.parse_args().ranks
    measure("mlx_jupyter", f"%load_ext mlx_jupyter\n%mlx_cluster start -n {n}", "%mlx_cluster stop", n)
    measure("ipyparallel", f"import ipyparallel as ipp\nrc = ipp.Cluster(n={n}, log_level=40).start_and_connect_sync()",
            "rc.cluster.stop_cluster_sync()", n)


if __name__ == "__main__":
    main()
