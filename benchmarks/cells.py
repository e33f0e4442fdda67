"""Cluster-ready time and cell round trips through a real kernel: %%mlx_distributed vs ipyparallel
%%px vs jupyter-distributed.

One run, 2 local ranks: ``python benchmarks/cells.py [--cells N]``. Prints medians and ratios.

jupyter-distributed (PyPI, benchmark only: ``pip install jupyter-distributed``; skipped when
missing) is driven as JupyterLab's "Processes" field does, without the server: its proxy kernel
(``python -m jupyter_distributed.kernel``, world size from ``JUPYTER_DISTRIBUTED_WORLD_SIZE``)
from a temporary kernel spec. It starts its ranks at the first cell, so its ready time is the
kernel's start plus that first cell. Ours reports its first cell (which binds `world` and
`group` on every rank) on a line of its own. It sets no MLX environment: the all_sum cell's setup wires
``MLX_RANK``/``MLX_HOSTFILE`` from its ``RANK`` by hand, as its users must.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

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
        first = k.run("%%mlx_distributed\nimport numpy as np, mlx_jupyter.distributed as d", 60).elapsed
        out = {"ready": ready, "first cell": first,
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


JD_SETUP = """\
import json, os, mlx.core as mx
os.environ["MLX_RANK"] = os.environ["RANK"]
_path = os.path.join({tmp!r}, "hostfile-%s.json" % os.environ["RANK"])
with open(_path, "w") as f:
    json.dump([["127.0.0.1:%d" % ({port} + r)] for r in range(int(os.environ["WORLD_SIZE"]))], f)
os.environ["MLX_HOSTFILE"] = _path
world = mx.distributed.init(backend="ring", strict=True)
assert mx.distributed.all_sum(mx.array([1.0])).item() == world.size() == 2
"""


def jupyter_distributed(n: int) -> dict:
    try:
        import jupyter_distributed as jd
    except ImportError:
        print("jupyter-distributed not installed: skipped (pip install jupyter-distributed)", file=sys.stderr)
        return {}
    from mlx_jupyter.ports import free_port_block

    with tempfile.TemporaryDirectory(prefix="bench-jd-") as tmp:
        spec = Path(tmp) / "kernels" / "jd2"
        spec.mkdir(parents=True)
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "jupyter_distributed.kernel", "-f", "{connection_file}"],
            "display_name": f"jupyter-distributed {jd.__version__} (2 processes)", "language": "python",
            "interrupt_mode": "message",
            "env": {"JUPYTER_DISTRIBUTED_WORLD_SIZE": "2", "JUPYTER_DISTRIBUTED_BASE_KERNEL": "python3"},
        }))
        os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [tmp, os.environ.get("JUPYTER_PATH")]))
        t0 = time.monotonic()
        k = Kernel(kernel_name="jd2")
        tree: set[int] = set()
        try:
            res = k.run("x = 0", 90)  # starts its ranks
            assert res.status == "ok", res
            ready = time.monotonic() - t0
            tree = {p.pid for p in psutil.Process(k.pid).children(recursive=True)}
            out = {"ready": ready, "trivial": timed(k, "x = 1", n)}
            res = k.run(JD_SETUP.format(tmp=tmp, port=free_port_block(2)), 60)
            assert res.status == "ok", res
            out["all_sum (MLX)"] = timed(k, "mx.eval(mx.distributed.all_sum(mx.ones(1024)))", n)
            return out
        finally:
            k.close()
            left = [p for p in tree if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
            if left:
                print(f"jupyter-distributed left rank processes {left}: killed", file=sys.stderr)
                for p in left:
                    psutil.Process(p).kill()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=20)
    n = ap.parse_args().cells
    a, b, c = ours(n), ipp_px(n), jupyter_distributed(n)
    fmt = lambda v: f"{v * 1000:9.1f} ms" if v is not None else "       n/a"  # noqa: E731
    ratio = lambda mine, theirs: f"{theirs / mine:6.1f}x" if mine and theirs else "    n/a"  # noqa: E731
    print(f"{'':18} {'mlx_jupyter':>12} {'ipyparallel':>12} {'ratio':>7} {'jupyter-dist.':>13} {'ratio':>7}")
    for key in ("ready", "first cell", "trivial", "all_sum (MLX)", "all_sum (ours)"):
        mine, ipp_v, jd_v = a.get(key), b.get(key), c.get(key)
        print(f"{key:18} {fmt(mine):>12} {fmt(ipp_v):>12} {ratio(mine, ipp_v)} {fmt(jd_v):>13} {ratio(mine, jd_v)}")
    print("ratio: their time / ours (above 1: we are faster)")


if __name__ == "__main__":
    main()
