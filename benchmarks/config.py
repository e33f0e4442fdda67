"""Configurator benchmark: ours vs MLX's ``mlx.distributed_config`` on the same fake Macs, in one run.

  sudo .venv/bin/python benchmarks/config.py [--delay 1] [--repeat 1] [--hosts 1,2,4,8]

Builds the namespace test bed (8 hosts with real sshd; needs root) and serves
the recorded ``eight-macs-ring`` cluster from it (tests/config_e2e/fake_macs.py),
with ``system_profiler`` taking --delay seconds as on a real Mac. Then times,
as command lines from start to exit:

1. discovery alone (``--dot``) on the first N hosts, for each N of --hosts;
2. the whole job on all 8 (``--auto-setup --output-hostfile``), and checks
   that both tools wrote the hostfile the recording says is correct.

For the sweep it prints both times, MLX's over ours, each tool's growth over its
own time at the smallest host count, and the least-squares seconds per extra
host: ours should stay near one host's time (flat), MLX's grows by about one
``system_profiler`` per host.

MLX's configurator reaches the hosts with ``ssh``; a wrapper first on PATH
runs OpenSSH with ``-F`` and the bed's config (OpenSSH ignores ``$HOME``, so
this is what keeps it away from the real ~/.ssh). Ours gets ``--ssh-config``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "config_e2e"), str(ROOT / "tests"), str(ROOT)]

from fake_macs import FakeCluster, openssh_wrapper  # noqa: E402
from testbed import TestBed, missing_requirements  # noqa: E402

PY = sys.executable
MLX_CONFIG = str(Path(PY).parent / "mlx.distributed_config")
CASE = ROOT / "tests" / "fixtures" / "thunderbolt" / "eight-macs-ring"
TIMEOUT = 300  # per command: MLX's sequential discovery of 8 hosts takes ~10 s at 1 s per system_profiler


def timed(argv: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    """Wall time of one command line (no stdin), and its result."""
    t0 = time.monotonic()
    res = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT, env=env,
                         cwd=ROOT)
    return time.monotonic() - t0, res


class Tools:
    """The two configurators' command lines and environments for one fake cluster."""

    def __init__(self, cluster: FakeCluster, tmp: Path) -> None:
        cfg = cluster.ssh_config(tmp / "ssh_config")
        openssh_wrapper(tmp / "bin", cfg)
        base = dict(os.environ)
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH", "")]))
        self.ours = ([PY, "-m", "mlx_jupyter", "config", "--ssh-config", str(cfg)], base)
        self.mlx = ([MLX_CONFIG], {**base, "PATH": f"{tmp / 'bin'}:{base['PATH']}"})

    def run(self, which: str, args: list[str], repeat: int) -> tuple[float, subprocess.CompletedProcess]:
        """Median wall time over ``repeat`` runs (and the last result); fails loudly on a non-zero exit."""
        argv, env = getattr(self, which)
        times, res = [], None
        for _ in range(repeat):
            took, res = timed([*argv, *args], env)
            if res.returncode != 0:
                raise RuntimeError(f"{which} {' '.join(args)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}")
            times.append(took)
        assert res is not None
        return statistics.median(times), res


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares seconds per extra host (0 with fewer than two host counts)."""
    if len({n for n, _ in points}) < 2:
        return 0.0
    mx = statistics.fmean(n for n, _ in points)
    my = statistics.fmean(t for _, t in points)
    return sum((n - mx) * (t - my) for n, t in points) / sum((n - mx) ** 2 for n, _ in points)


def bench_discovery(bed: TestBed, tmp: Path, counts: list[int], delay: float, repeat: int) -> None:
    """The sweep: discovery time per host count, each tool's growth over its own 1-host (smallest) time."""
    names = [n.strip() for n in (CASE / "hosts.txt").read_text().split() if n.strip()]
    print(f"discovery (--dot), system_profiler takes {delay:g} s; median of {repeat}:")
    print(f"{'hosts':>5}  {'ours':>7}  {'mlx':>7}  {'mlx/ours':>8}  {'ours growth':>11}  {'mlx growth':>10}")
    rows: list[tuple[int, float, float]] = []
    for n in counts:
        cluster = FakeCluster(bed, CASE, hosts=names[:n], profiler_delay=delay)
        try:
            tools = Tools(cluster, tmp)
            args = ["--hosts", ",".join(names[:n]), "--over", "thunderbolt", "--dot"]
            ours, _ = tools.run("ours", args, repeat)
            mlx, _ = tools.run("mlx", args, repeat)
        finally:
            cluster.remove()
        rows.append((n, ours, mlx))
        base_ours, base_mlx = rows[0][1], rows[0][2]
        print(f"{n:>5}  {ours:>6.2f}s  {mlx:>6.2f}s  {mlx / ours:>7.1f}x  {ours / base_ours:>10.2f}x  "
              f"{mlx / base_mlx:>9.2f}x", flush=True)
    per_ours = slope([(n, t) for n, t, _ in rows])
    per_mlx = slope([(n, t) for n, _, t in rows])
    print(f"  per extra host: ours {per_ours:+.2f} s, mlx {per_mlx:+.2f} s "
          f"(one host's system_profiler alone takes {delay:g} s)")


def bench_full(bed: TestBed, tmp: Path, delay: float, repeat: int) -> None:
    correct = json.loads((CASE / "expected.json").read_text())["correct"]["auto"]["hostfile"]
    cluster = FakeCluster(bed, CASE, profiler_delay=delay)
    try:
        tools = Tools(cluster, tmp)
        print(f"\nwhole run on {len(cluster.names)} hosts (--auto-setup --output-hostfile; sudo everywhere):")
        took: dict[str, float] = {}
        for which in ("ours", "mlx"):
            out = tmp / f"{which}.json"
            args = ["--hosts", ",".join(cluster.names), "--over", "thunderbolt", "--auto-setup",
                    "--output-hostfile", str(out)]
            cluster.clear_logs()
            took[which], _ = tools.run(which, args, repeat)
            ok = json.loads(out.read_text()) == correct
            sent = sum(len(m.sent_setup()) for m in cluster.macs.values()) // repeat
            print(f"  {which:>4}: {took[which]:6.2f} s, hostfile {'correct' if ok else 'WRONG'}, "
                  f"{sent} setup commands sent", flush=True)
        print(f"  mlx/ours: {took['mlx'] / took['ours']:.1f}x")
    finally:
        cluster.remove()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--delay", type=float, default=1.0, help="seconds system_profiler takes (default 1)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per measurement (median)")
    ap.add_argument("--hosts", default="1,2,4,8", help="host counts for the discovery sweep (max 8)")
    args = ap.parse_args()
    why = missing_requirements()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    if not os.path.exists(MLX_CONFIG):
        print(f"cannot run: {MLX_CONFIG} not found (pip install mlx)", file=sys.stderr)
        return 2
    counts = [int(c) for c in args.hosts.split(",")]
    with tempfile.TemporaryDirectory(prefix="mlxj-bench-config.") as tmpdir:
        tmp = Path(tmpdir)
        bed = TestBed(tmp / "bed", n=8).up()
        try:
            bench_discovery(bed, tmp, counts, args.delay, args.repeat)
            bench_full(bed, tmp, args.delay, args.repeat)
        finally:
            bed.down()
            left = bed.leftovers()
            if left:
                print(f"warning: test bed left behind: {left}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
