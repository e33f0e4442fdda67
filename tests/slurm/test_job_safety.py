"""No Slurm job leaks (issue 31 §3): an sbatch that answers too late after queueing the job, and a
job-name override that would leave the watchdog's name-based cancel matching nothing. Real daemons."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from launch_helpers import PY, cli, cli_env
from mlx_jupyter.cluster import Cluster, ClusterError
from mlx_jupyter.launch.slurm import commands
from slurm_helpers import ROOT, wait_until

pytestmark = pytest.mark.timeout(120)

#: the bound our test puts on every Slurm command; the slowed sbatch answers only after it
LATE = 3.0


def slow_sbatch(folder: Path) -> Path:
    """An ``sbatch`` for the front of PATH: it sleeps, runs the real one (the job is queued), and then
    does not answer for a minute (a slurmctld whose reply is lost, a busy network)."""
    real = shutil.which("sbatch")
    assert real, "Slurm's sbatch is not installed"
    script = folder / "sbatch"
    script.write_text(f"#!/bin/sh\nexec >/dev/null 2>&1 </dev/null\nsleep 1\n'{real}' \"$@\"\nexec sleep 60\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def our_jobs(bed) -> dict[str, str]:
    """Every job of the queue (finished ones too, while slurmctld keeps them) named mlx-jupyter-…: name -> state."""
    out = bed.slurm("squeue", "--noheader", "--states=all", "--format=%j %T", check=False).stdout
    return dict(line.split() for line in out.splitlines() if line.startswith("mlx-jupyter-"))


def test_a_cluster_whose_sbatch_answers_too_late_cancels_the_queued_job(slurm, monkeypatch, tmp_path):
    before = set(our_jobs(slurm))
    monkeypatch.setenv("PATH", f"{slow_sbatch(tmp_path)}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(commands, "TIMEOUT", LATE)
    cluster = Cluster(scheduler="slurm", nodes=1, timeout=60)
    try:
        with pytest.raises(ClusterError, match=rf"sbatch did not answer within {LATE:g} s.*a job it may have "
                                               r"queued, named (mlx-jupyter-\w+), was cancelled"):
            cluster.start()
    finally:
        cluster.stop()
    name = cluster.allocation.name
    # it was queued (sbatch ran) and it is cancelled, not left holding its node until its time limit
    assert wait_until(lambda: our_jobs(slurm).get(name) == "CANCELLED", 15), (name, our_jobs(slurm), before)


#: ``mlx-jupyter launch ARGS`` with the bound on every Slurm command set to LATE (as the test above sets it in
#: this process), instead of the default 30 s the slowed sbatch would be waited out for
LAUNCH_WITH_LATE_BOUND = ("import sys\nfrom mlx_jupyter.launch.slurm import commands\n"
                          f"commands.TIMEOUT = {LATE!r}\nfrom mlx_jupyter.cli import main\nsys.exit(main())")


def test_a_launch_whose_sbatch_answers_too_late_cancels_the_queued_job(slurm, tmp_path):
    """The launcher's way, which the cluster now shares: its watchdog cancels the job by name."""
    env = {"SLURM_CONF": str(slurm.conf), "PYTHONPATH": str(ROOT),
           "PATH": f"{slow_sbatch(tmp_path)}{os.pathsep}{os.environ['PATH']}"}
    before = set(our_jobs(slurm))
    # the launch's bound on sbatch (LATE here, 30 s by default): the slowed sbatch (a minute) is past it
    assert commands.TIMEOUT == 30.0
    res = subprocess.run([PY, "-c", LAUNCH_WITH_LATE_BOUND, "launch", "--slurm", "--nodes", "1", PY, "-c",
                          "print('must not run')"], capture_output=True, text=True, timeout=90, env=cli_env(env),
                         cwd=ROOT)
    assert res.returncode == 1 and f"sbatch did not answer within {LATE:g} s" in res.stderr, res.stderr
    new = {n: s for n, s in our_jobs(slurm).items() if n not in before}
    assert wait_until(lambda: {n: s for n, s in our_jobs(slurm).items() if n not in before}
                      and all(s == "CANCELLED" for n, s in our_jobs(slurm).items() if n not in before), 15), new
    assert "must not run" not in res.stdout


@pytest.mark.parametrize("arg", ["-J mine", "--job-name=mine", "--time=5 --job-name mine"])
def test_a_job_name_override_is_refused_naming_the_flag(slurm, arg):
    before = our_jobs(slurm)
    with pytest.raises(ValueError, match=rf"--slurm-arg '{arg}': the job's name is mlx-jupyter's own"):
        Cluster(scheduler="slurm", nodes=1, slurm_args=[arg])
    res = cli(["--slurm", "--nodes", "1", f"--slurm-arg={arg}", PY, "-c", "print(1)"], env=slurm.env())
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        f"mlx-jupyter launch: error: --slurm-arg '{arg}': the job's name is mlx-jupyter's own (mlx-jupyter-…, "
        "unique), which its watchdog cancels the job by if this process dies before sbatch answers; a name of "
        "yours would match nothing (or your other jobs of that name). Drop -J/--job-name."], res.stderr
    assert our_jobs(slurm) == before   # nothing was submitted
