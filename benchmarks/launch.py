"""Launcher benchmark: ours vs ``mlx.launch`` on the same 4 ssh hosts, in one run.

  sudo .venv/bin/python benchmarks/launch.py [--repeat 3] [--sleep 5]

Builds the namespace test bed (4 hosts, real sshd; needs root), then for each
launcher measures (1) wall time to start 4 ranks of ``python -c pass`` and tear
down (median of --repeat runs), and (2) the launcher's CPU (its process tree on
this machine, ssh clients included) while the 4 ranks sleep --sleep seconds.
Prints both and the ratios. ``mlx.launch`` reaches the hosts through ``ssh``,
which we point at the bed's keys with a wrapper on PATH.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

PY = sys.executable
MLX_LAUNCH = str(Path(PY).parent / "mlx.launch")


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its live descendants."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


class Run:
    """A launcher process whose output lines are counted as they arrive."""

    def __init__(self, argv: list[str], env: dict):
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     env=env)
        self.lines: list[str] = []
        self.cond = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            with self.cond:
                self.lines.append(raw.decode(errors="replace"))
                self.cond.notify_all()

    def wait_lines(self, word: str, count: int, timeout: float) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: sum(word in x for x in self.lines) >= count, timeout):
                raise TimeoutError(f"no {count} x {word!r} within {timeout} s:\n{''.join(self.lines)}")

    def finish(self, timeout: float) -> float:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise
        self.reader.join(5)
        return time.monotonic() - self.t0


def launchers(bed, bindir: Path) -> dict[str, tuple[list[str], dict]]:
    hosts = ",".join(bed.ips)
    ours_env = dict(os.environ, PYTHONPATH=str(ROOT))
    mlx_env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return {
        "mlx-jupyter launch": ([PY, "-m", "mlx_jupyter", "launch", *bed.cli_ssh_args(), "--hosts", hosts], ours_env),
        "mlx.launch": ([MLX_LAUNCH, "--hosts", hosts], mlx_env),
    }


def ssh_wrapper(bed, bindir: Path, tmpdir: Path) -> None:
    """An ``ssh`` on PATH that uses the bed's key and known_hosts, and a private TMPDIR (for mlx.launch)."""
    cfg = bindir / "ssh_config"
    cfg.write_text(f"Host *\n  User root\n  IdentityFile {bed.key}\n  IdentitiesOnly yes\n"
                   f"  UserKnownHostsFile {bed.known_hosts}\n  StrictHostKeyChecking yes\n  BatchMode yes\n")
    wrapper = bindir / "ssh"
    wrapper.write_text(f"#!/bin/sh\nexec /usr/bin/ssh -F '{cfg}' -o SetEnv=TMPDIR='{tmpdir}' \"$@\"\n")
    wrapper.chmod(0o755)


def bench_startup(argv: list[str], env: dict, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        run = Run([*argv, PY, "-c", "print('up', flush=True)"], env)
        run.wait_lines("up", 4, 60)
        times.append(run.finish(60))
    return statistics.median(times)


def bench_idle(argv: list[str], env: dict, seconds: float) -> float:
    code = f"import time; print('ready', flush=True); time.sleep({seconds}); print('done', flush=True)"
    run = Run([*argv, PY, "-c", code], env)
    run.wait_lines("ready", 4, 60)
    t0, c0 = time.monotonic(), tree_cpu(run.proc.pid)
    run.wait_lines("done", 1, seconds + 30)
    t1, c1 = time.monotonic(), tree_cpu(run.proc.pid)
    run.finish(60)
    return (c1 - c0) / (t1 - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sleep", type=float, default=5.0)
    args = ap.parse_args()
    from testbed import TestBed, missing_requirements

    why = missing_requirements()
    if why:
        print(f"benchmark skipped: {why}")
        return 0
    if not os.access(MLX_LAUNCH, os.X_OK):
        print(f"benchmark skipped: {MLX_LAUNCH} not found (pip install 'mlx[cpu]')")
        return 0
    with tempfile.TemporaryDirectory(prefix="mlxj-bench-") as tmp:
        bed = TestBed(Path(tmp) / "bed", n=4).up()
        try:
            bindir, hosts_tmp = Path(tmp) / "bin", Path(tmp) / "hosts-tmp"
            bindir.mkdir()
            hosts_tmp.mkdir()
            ssh_wrapper(bed, bindir, hosts_tmp)
            results = {}
            for name, (argv, env) in launchers(bed, bindir).items():
                start = bench_startup(argv, env, args.repeat)
                idle = bench_idle(argv, env, args.sleep)
                results[name] = (start, idle)
                print(f"{name:20s} start+teardown of 4 ranks on 4 hosts: {start:6.3f} s (median of {args.repeat}); "
                      f"CPU while ranks sleep: {idle * 100:6.2f} % of a core")
            left = len(list(hosts_tmp.iterdir()))
            print(f"(mlx.launch left {left} temp files on the hosts, removed now; ours leaves none)")
        finally:
            bed.down()
    (ours_s, ours_c), (ref_s, ref_c) = results["mlx-jupyter launch"], results["mlx.launch"]
    print(f"start+teardown: mlx.launch / ours = {ref_s / ours_s:.2f}x")
    print(f"idle CPU:       mlx.launch / ours = {ref_c / max(ours_c, 1e-4):.1f}x "
          f"(ours {ours_c * 100:.2f} %, reference {ref_c * 100:.2f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
