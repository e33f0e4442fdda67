"""Where a trivial ``%%mlx_distributed`` cell's CPU goes: per process, through a real kernel.

``python benchmarks/cell_cpu.py [--cells N]``: starts a 2-rank local cluster from a kernel,
runs N plain cells (``pass``) and N trivial distributed cells (``x = 1``), and prints the
median round trip, the CPU each process (kernel, controller, engines) spent per cell, how often
each process's main thread slept and was woken per cell (voluntary context switches: every one
on a cell's path is a scheduling delay on a loaded machine), and the kernel's CPU per thread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.cluster.kernel import Kernel  # noqa: E402


def role(p: psutil.Process) -> str:
    cmd = " ".join(p.cmdline())
    for name, module in (("controller", "mlx_jupyter.cluster.ipcontroller"), ("engine", "mlx_jupyter.cluster.rank.engine")):
        if module in cmd:
            return f"{name} {p.pid}"
    return ""


def cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def wakes(p: psutil.Process) -> int:
    """The main thread's voluntary context switches so far (Linux counts them per thread)."""
    return p.num_ctx_switches().voluntary


def threads(p: psutil.Process) -> dict[int, float]:
    return {t.id: t.user_time + t.system_time for t in p.threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=200)
    n = ap.parse_args().cells
    k = Kernel()
    try:
        k.run("%load_ext mlx_jupyter", 30)
        assert k.run("%mlx_cluster start -n 2", 60).status == "ok"
        k.run("%%mlx_distributed\nx = 0", 60)
        kernel = psutil.Process(k.pid)
        procs = {"kernel": kernel}
        procs.update({role(c): c for c in kernel.children(recursive=True) if role(c)})
        names = json.loads(k.run("import threading, json\n"
                                 "print(json.dumps({t.native_id: t.name for t in threading.enumerate()}))", 30).stdout)
        for code in ("pass", "%%mlx_distributed\nx = 1"):
            before = {name: (cpu(p), wakes(p)) for name, p in procs.items()}
            per_thread = threads(kernel)
            times = [k.run(code, 30).elapsed for _ in range(n)]
            print(f"{code!r}: median {statistics.median(times) * 1e3:.2f} ms; per cell, CPU and main-thread wake-ups:")
            for name, p in procs.items():
                print(f"  {(cpu(p) - before[name][0]) / n * 1e3:6.2f} ms {(wakes(p) - before[name][1]) / n:6.2f}  {name}")
            spent = {names.get(str(tid), f"thread {tid}"): (t - per_thread.get(tid, 0.0)) / n * 1e3
                     for tid, t in threads(kernel).items()}
            print("  kernel threads: " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in
                                                   sorted(spent.items(), key=lambda kv: -kv[1]) if ms >= 0.01))
        k.run("%mlx_cluster stop", 30)
    finally:
        k.close()


if __name__ == "__main__":
    main()
