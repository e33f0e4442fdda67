"""A restart that keeps the ranks' state against a clean restart plus re-running the cells that
built it, on local ranks each holding ``--gib`` GiB of arrays (half numpy float32, half MLX
float32) and a small MLX model with its Adam optimizer after one step.

    .venv/bin/python benchmarks/restart.py [--ranks 2,8] [--gib 1] [--killed] [--save benchmarks/results/restart.txt]

For each rank count: build the state (timed: the "cells that built it"), restart keeping it
(timed, the report line printed), check on every rank that a sample of every array and the
model's output are bit for bit what they were, then restart clean (timed) and build again
(timed). Memory: a keep-state restart holds the ranks' arrays twice for a moment (the ranks and
the host-local files), so 8 ranks x 1 GiB needs about 16 GiB free.
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import time

BUILD = """
import numpy as np
import mlx.nn as nn, mlx.optimizers as optim
r = world.rank()
half = int({gib} * 2 ** 30) // 2 // 4 // 4   # four arrays of each kind, float32
data = {{f"np{{k}}": np.random.default_rng(100 * r + k).standard_normal(half, dtype=np.float32) for k in range(4)}}
data.update({{f"mx{{k}}": mx.random.normal((half,), key=mx.random.key(100 * r + k)) for k in range(4)}})
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))
opt = optim.Adam(learning_rate=1e-3)
x = mx.random.normal((32, 256), key=mx.random.key(r))
loss = lambda m, x: (m(x) ** 2).mean()
opt.update(model, nn.value_and_grad(model, loss)(model, x)[1])
mx.eval(model.parameters(), opt.state, *[v for v in data.values() if isinstance(v, mx.array)])
"""

FINGERPRINT = """
import hashlib
_h = hashlib.sha1()
for _k in sorted(data):
    _h.update(np.array(data[_k][:: 4099]).tobytes())
_h.update(np.array(model(x)).tobytes())
_h.update(np.array(opt.state["step"]).tobytes())
fp = _h.hexdigest()
"""


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def one(ranks: int, gib: float, out) -> None:
    from mlx_jupyter.cluster import Cluster
    from mlx_jupyter.cluster.cells.display import show_run

    build = BUILD.format(gib=gib)
    with Cluster(n=ranks, timeout=180) as c:
        built = timed(lambda: show_run(c.run(build), timeout=600))
        show_run(c.run(FINGERPRINT), timeout=120)
        before = c.pull("fp")
        kept = timed(lambda: c.restart(timeout=180, quiet=True))
        report = c.last_restart
        show_run(c.run(FINGERPRINT), timeout=120)
        same = c.pull("fp") == before
        clean = timed(lambda: c.restart(timeout=180, clean=True))
        rebuilt = timed(lambda: show_run(c.run(build), timeout=600))
    print(f"ranks {ranks} x {gib:g} GiB: build {built:.2f} s", file=out)
    print(f"ranks {ranks}: {report}", file=out)
    print(f"ranks {ranks}: keep-state restart {kept:.2f} s (values bit for bit: {same})", file=out)
    print(f"ranks {ranks}: clean restart {clean:.2f} s + rebuild {rebuilt:.2f} s = {clean + rebuilt:.2f} s", file=out)
    print(f"ranks {ranks}: keep-state / (clean + rebuild) = {kept / (clean + rebuilt):.2f}", file=out, flush=True)
    if not same:
        raise SystemExit("the values after the keep-state restart differ")


def one_killed(ranks: int, gib: float, out, sequential: bool = False) -> None:
    """The same state, the last rank killed with SIGKILL, then a keep-state restart (the dead rank
    gets its peers' alike names: the model, the optimizer; its own arrays differ, so are lost).
    ``sequential``: the dead rank's copy first, then the live ranks' restore (the order before)."""
    import signal

    from mlx_jupyter.cluster import Cluster
    from mlx_jupyter.cluster.cells.display import show_run
    from mlx_jupyter.cluster.kept_state import KeptState

    together = KeptState._run_plan

    def one_after_the_other(self, plan, what):
        first = {r: p for r, p in plan.items() if r in self.died}
        if not first or len(first) == len(plan):
            return together(self, plan, what)
        answers = together(self, first, what)
        answers.update(together(self, {r: p for r, p in plan.items() if r not in first}, what))
        return answers

    KeptState._run_plan = one_after_the_other if sequential else together

    with Cluster(n=ranks, timeout=180) as c:
        show_run(c.run(BUILD.format(gib=gib) + "\nmodel_copy = model\n"), timeout=600)
        victim = ranks - 1
        os.kill(c.rank_infos()[victim].pid, signal.SIGKILL)
        end = time.monotonic() + 30
        while victim not in c.dead and time.monotonic() < end:
            time.sleep(0.05)
        kept = timed(lambda: c.restart(timeout=180, quiet=True))
        report = c.last_restart
    KeptState._run_plan = together
    order = "copy, then the live ranks' restore" if sequential else "copy beside the live ranks' restore"
    print(f"ranks {ranks} x {gib:g} GiB, rank {victim} killed: keep-state restart {kept:.2f} s ({order})", file=out)
    print(f"ranks {ranks}: {report}", file=out, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,8", help="rank counts, comma-separated (default 2,8)")
    ap.add_argument("--gib", type=float, default=1.0, help="GiB of arrays per rank (default 1)")
    ap.add_argument("--save", default=None, help="also write the output to this file")
    ap.add_argument("--killed", action="store_true",
                    help="instead: kill the last rank (SIGKILL), then time the keep-state restart")
    ap.add_argument("--alternate", type=int, default=0, metavar="N",
                    help="with --killed: N rounds alternating the dead rank's copy after and beside the live restore")
    args = ap.parse_args()
    buf = io.StringIO()

    class Tee(io.TextIOBase):
        def write(self, s: str) -> int:
            sys.stdout.write(s)
            buf.write(s)
            return len(s)

    tee = Tee()
    import mlx.core as mx

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"restart benchmark: {platform.platform()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"mlx {mx.__version__}; load average at the start: {load}", file=tee)
    for n in (int(x) for x in args.ranks.split(",")):
        if args.killed and args.alternate:
            for k in range(2 * args.alternate):
                one_killed(n, args.gib, tee, sequential=(k % 2 == 0) == (k // 2 % 2 == 0))
        else:
            (one_killed if args.killed else one)(n, args.gib, tee)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", file=tee)
    if args.save:
        with open(args.save, "w") as f:
            f.write(buf.getvalue())


if __name__ == "__main__":
    main()
