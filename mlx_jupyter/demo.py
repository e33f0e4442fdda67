"""`mlx-jupyter demo`: a local 2-rank job that all-sums with our core and with MLX's ring."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile

RANK_CODE = """
import numpy as np, mlx.core as mx
from mlx_jupyter import distributed as dist
group = dist.init(strict=True, backend="ring", timeout=30)
world = mx.distributed.init(strict=True, backend="ring")
r = group.rank()
ours = dist.all_sum(np.arange(4, dtype=np.float32) + r, timeout=30)
theirs = mx.distributed.all_sum(mx.arange(4, dtype=mx.float32) + r, group=world)
mx.eval(theirs)
print(f"rank {r} of {group.size()}: mlx_jupyter all_sum = {ours.tolist()}, MLX all_sum = {np.array(theirs).tolist()}", flush=True)
"""


def free_ports(n: int) -> list[int]:
    """n ports free now on loopback, each with port+1000 free too (our core's offset)."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + 1000 > 65535 or p in ports:
            continue
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.1", p + 1000))
        except OSError:
            continue
        ports.append(p)
    return ports


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mlx-jupyter demo", description=__doc__)
    parser.add_argument("-n", type=int, default=2, help="number of local ranks (default 2)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mlxj-demo-") as tmp:
        hostfile = os.path.join(tmp, "hostfile.json")
        with open(hostfile, "w") as fh:
            json.dump([[f"127.0.0.1:{p}"] for p in free_ports(args.n)], fh)
        token = os.urandom(16).hex()
        procs = [
            subprocess.Popen([sys.executable, "-c", RANK_CODE], cwd=tmp,
                             env={**os.environ, "MLX_RANK": str(r), "MLX_HOSTFILE": hostfile, "MLX_JUPYTER_TOKEN": token})
            for r in range(args.n)
        ]
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=120))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                print("demo: ranks did not finish within 120 s", file=sys.stderr)
                return 1
    failed = [r for r, c in enumerate(codes) if c]
    if failed:
        print(f"demo: rank(s) {failed} failed", file=sys.stderr)
        return 1
    print(f"demo: {args.n} ranks agree; expected {[sum(i + r for r in range(args.n)) for i in range(4)]}")
    return 0
