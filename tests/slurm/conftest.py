"""Fixtures for the Slurm tests: a real Slurm cluster of 4 namespace nodes (tests/slurmbed.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT / "tests", ROOT / "tests" / "launch", ROOT / "tests" / "slurm", ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from slurm_helpers import rank_temp_files, wait_until  # noqa: E402
from needs import require  # noqa: E402
from slurmbed import SlurmBed, missing_requirements  # noqa: E402


@pytest.fixture(scope="session")
def slurmbed(tmp_path_factory):
    """slurmctld, munged and 4 slurmds (node1..node4, 2 CPUs each), shared by the session."""
    require("the Slurm test bed (root, slurmctld, slurmd, munge)", missing_requirements())
    bed = SlurmBed(tmp_path_factory.mktemp("slurmbed"), n=4, cpus=2).up()
    try:
        yield bed
    finally:
        bed.down()
        left = bed.leftovers()
        assert not left, f"the Slurm bed left behind: {left}"


@pytest.fixture
def slurm(slurmbed, monkeypatch, tmp_path_factory):
    """The bed, with SLURM_CONF set for this process; afterwards: no job left in the queue, every node
    idle again, no temp file of a task wrapper left. The tasks get a TMPDIR of this test's own (srun
    exports our environment), so that what other users of this machine's /tmp make is not counted."""
    monkeypatch.setenv("SLURM_CONF", str(slurmbed.conf))
    tmp = tmp_path_factory.mktemp("task-tmp")
    tmp.chmod(0o1777)   # the tasks may run as another user
    monkeypatch.setenv("TMPDIR", str(tmp))
    before = rank_temp_files(tmp)
    yield slurmbed
    queue = lambda: slurmbed.slurm("squeue", "--noheader", "--format=%i %j %T", check=False).stdout.strip()  # noqa: E731
    left = "" if wait_until(lambda: not queue(), 10) else queue()
    if left:
        slurmbed.slurm("scancel", "--user=root", check=False)
    slurmbed.wait_idle()
    assert not left, f"jobs left in the queue: {left}"
    assert rank_temp_files(tmp) <= before, f"temp files left: {rank_temp_files(tmp) - before}"
