"""Fixtures for the Slurm tests: a real Slurm cluster of 4 namespace nodes (tests/slurmbed.py)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT / "tests", ROOT / "tests" / "launch", ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from slurmbed import SlurmBed, missing_requirements  # noqa: E402


@pytest.fixture(scope="session")
def slurmbed(tmp_path_factory):
    """slurmctld, munged and 4 slurmds (node1..node4, 2 CPUs each), shared by the session."""
    why = missing_requirements()
    if why:
        pytest.skip(why)
    bed = SlurmBed(tmp_path_factory.mktemp("slurmbed"), n=4, cpus=2).up()
    try:
        yield bed
    finally:
        bed.down()
        left = bed.leftovers()
        assert not left, f"the Slurm bed left behind: {left}"


def rank_temp_files() -> set[Path]:
    """What task wrappers leave in /tmp (the nodes share this machine's /tmp)."""
    return set(Path("/tmp").glob("mlx-jupyter.*"))


def wait_until(pred, timeout: float) -> bool:
    """Probe ``pred`` until true or timeout (for state outside this process: Slurm's queue)."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not pred():
        if time.monotonic() > deadline:
            return False
        pause.wait(0.1)
    return True


@pytest.fixture
def slurm(slurmbed, monkeypatch):
    """The bed, with SLURM_CONF set for this process; afterwards: no job left in the queue, every node
    idle again, no temp file of a task wrapper left."""
    monkeypatch.setenv("SLURM_CONF", str(slurmbed.conf))
    before = rank_temp_files()
    yield slurmbed
    queue = lambda: slurmbed.slurm("squeue", "--noheader", "--format=%i %j %T", check=False).stdout.strip()  # noqa: E731
    left = "" if wait_until(lambda: not queue(), 10) else queue()
    if left:
        slurmbed.slurm("scancel", "--user=root", check=False)
    slurmbed.wait_idle()
    assert not left, f"jobs left in the queue: {left}"
    assert rank_temp_files() <= before, f"temp files left: {rank_temp_files() - before}"
