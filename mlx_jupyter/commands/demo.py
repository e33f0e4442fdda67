"""`mlx-jupyter demo`: a local 2-rank job that all-sums with our core and with MLX's ring."""

from __future__ import annotations

import argparse
import sys
import tempfile

from mlx_jupyter.vocab.ports import free_port_block

RANK_CODE = """
import sys
import numpy as np, mlx.core as mx
from mlx_jupyter import distributed as dist
group = dist.init(strict=True, backend="ring", timeout=30)
world = mx.distributed.init(strict=group.size() > 1, backend="ring")  # MLX cannot form a strict 1-rank ring
r, n = group.rank(), group.size()
ours = dist.all_sum(np.arange(4, dtype=np.float32) + r, timeout=30).tolist()
theirs = mx.distributed.all_sum(mx.arange(4, dtype=mx.float32) + r, group=world)
mx.eval(theirs)
theirs = np.array(theirs).tolist()
expected = [float(n * i + n * (n - 1) // 2) for i in range(4)]
print(f"rank {r} of {n}: mlx_jupyter all_sum = {ours}, MLX all_sum = {theirs}", flush=True)
if not ours == theirs == expected:
    print(f"rank {r}: the sums differ from the expected {expected}", file=sys.stderr, flush=True)
    sys.exit(1)
"""


def expected_sum(n: int) -> list[float]:
    """What every rank's all_sum of ``arange(4) + rank`` must be."""
    return [float(n * i + n * (n - 1) // 2) for i in range(4)]


def main(argv: list[str], rank_code: str = RANK_CODE) -> int:
    parser = argparse.ArgumentParser(prog="mlx-jupyter demo", description=__doc__)
    parser.add_argument("-n", type=int, default=2, help="number of local ranks (default 2)")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("-n must be at least 1")
    from mlx_jupyter.launch import Launcher

    with tempfile.TemporaryDirectory(prefix="mlxj-demo-") as tmp:
        launcher = Launcher([sys.executable, "-c", rank_code], hosts="127.0.0.1", repeat_hosts=args.n,
                            starting_port=free_port_block(args.n), cwd=tmp)
        launcher.start()
        try:
            code = launcher.wait(timeout=120)
        except TimeoutError:
            launcher.stop()
            print("demo: ranks did not finish within 120 s", file=sys.stderr)
            return 1
    if code:
        print(f"demo: {launcher.summary()}", file=sys.stderr)
        return code
    # every rank exited 0 only if its two sums equal the expected values (RANK_CODE checks)
    print(f"demo: {args.n} ranks agree: ours and MLX's all_sum both gave {expected_sum(args.n)} on every rank")
    return 0
