"""Where a trivial ``%%mlx_distributed`` cell's CPU goes: per process, through a real kernel.

``python benchmarks/cell_cpu.py [--cells N]``: starts a 2-rank local cluster from a kernel,
runs N plain cells (``pass``) and N trivial distributed cells (``x = 1``), and prints the
median round trip and the CPU each process (kernel, controller, engines) spent per cell.
"""

from __future__ import annotations

import argparse
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
        for code in ("pass", "%%mlx_distributed\nx = 1"):
            before = {name: cpu(p) for name, p in procs.items()}
            times = [k.run(code, 30).elapsed for _ in range(n)]
            print(f"{code!r}: median {statistics.median(times) * 1e3:.2f} ms; CPU per cell:")
            for name, p in procs.items():
                print(f"  {(cpu(p) - before[name]) / n * 1e3:6.2f} ms  {name}")
        k.run("%mlx_cluster stop", 30)
    finally:
        k.close()


if __name__ == "__main__":
    main()
