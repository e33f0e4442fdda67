"""The speed guards run end to end (tiny sizes and iterations; no timing is asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_compare_runs_two_builds_through_our_launcher() -> None:
    """`compare.py . .`: this checkout against itself, ranks started by `mlx-jupyter launch`."""
    out = _run("benchmarks/compare.py", ".", ".", "--runs", "2", "--scale", "0.01", "--layout", "small")
    assert "run 1: 2r 4 KiB" in out and "run 2: 2r 4 KiB" in out
    row = next(line for line in out.splitlines() if line.split()[:3] == ["2", "4", "KiB"])
    assert "to" in row  # the spread over runs


def test_allreduce_launcher_layout_runs() -> None:
    out = _run("benchmarks/allreduce.py", "--layout", "launcher", "--ranks", "2", "--runs", "2", "--scale", "0.01")
    assert "ours started by `mlx-jupyter launch -n 2`" in out
    assert "run 2 (Open MPI first" in out
    assert any(line.strip().startswith("4 KiB |") for line in out.splitlines())
