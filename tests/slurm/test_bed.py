"""The Slurm test bed's one command, as a user runs it: up, status, down, and nothing left."""

from __future__ import annotations

import subprocess
import sys

import pytest

from slurm_helpers import ROOT
from needs import require
from slurmbed import SlurmBed, missing_requirements

pytestmark = pytest.mark.timeout(120)


def test_up_status_down_leaves_nothing(tmp_path):
    require("the Slurm test bed (root, slurmctld, slurmd, munge)", missing_requirements())
    bed_dir = tmp_path / "bed"
    run = lambda *a: subprocess.run([sys.executable, str(ROOT / "tests" / "slurmbed.py"), *a, "--dir", str(bed_dir)],  # noqa: E731
                                    capture_output=True, text=True, timeout=90)
    up = run("up", "--nodes", "2")
    bed = SlurmBed.load(bed_dir) if (bed_dir / "bed.json").exists() else None
    try:
        assert up.returncode == 0, up.stderr
        assert up.stdout == f"export SLURM_CONF={bed_dir}/slurm.conf\n"
        assert run("up").returncode == 1   # one bed per dir
        status = run("status")
        assert status.returncode == 0 and [line.split()[0] for line in status.stdout.splitlines()[1:]] == ["node1", "node2"]
        assert all("idle" in line for line in status.stdout.splitlines()[1:])
        hostnames = bed.slurm("srun", "--nodes=2", "--label", "hostname").stdout
        assert sorted(hostnames.split()) == ["0:", "1:", "node1", "node2"]
    finally:
        down = run("down")
    assert down.returncode == 0, down.stderr
    assert bed is not None and not bed.leftovers()
