"""``mlx-jupyter launch --slurm`` against real Slurm daemons: 4 nodes in network namespaces (tests/slurmbed.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_helpers import wait_until
from launch_helpers import PY, ROOT, LiveCLI, cli, collector

pytestmark = pytest.mark.timeout(120)

MLX_RING = ("import mlx.core as mx; g = mx.distributed.init(backend='ring', strict=True); "
            "x = mx.distributed.all_sum(mx.arange(4) + g.rank()); print(g.rank(), g.size(), x.tolist())")
OUR_CORE = ("import numpy as np; from mlx_jupyter import distributed as d; g = d.init(backend='ring', strict=True); "
            "x = d.all_sum(np.arange(4, dtype=np.int64) + g.rank()); print(g.rank(), g.size(), list(map(int, x)))")


def env_of(bed, **extra) -> dict:
    return {**bed.env(), "PYTHONPATH": str(ROOT), **extra}


def by_rank(stdout: str) -> dict[int, str]:
    """``[rank r] text`` lines -> {r: text} (the last line of each rank)."""
    out = {}
    for line in stdout.splitlines():
        m = re.match(r"\[rank +(\d+)\] (.*)$", line)
        if m:
            out[int(m.group(1))] = m.group(2)
    return out


def sums(n: int) -> dict[int, str]:
    """What every rank prints for all_sum(arange(4) + rank) over n ranks."""
    total = [n * i + n * (n - 1) // 2 for i in range(4)]
    return {r: f"{r} {n} {total}" for r in range(n)}


def jobs(bed) -> list[str]:
    """squeue lines (our format), finished jobs included."""
    res = bed.slurm("squeue", "--noheader", "--states=all", "--format=%i %j %T %r", check=False)
    return res.stdout.splitlines()


def job_state(bed, job: int) -> str:
    line = bed.slurm("squeue", "--noheader", "--states=all", f"--jobs={job}", "--format=%T", check=False).stdout
    return line.strip()


def live_jobs(bed) -> str:
    return bed.slurm("squeue", "--noheader", "--format=%i %T", check=False).stdout.strip()


def job_id_of(run: LiveCLI) -> int:
    return int(re.search(r"Slurm job (\d+)", run.wait_for(r"Slurm job \d+")[0]).group(1))


def test_mlx_ring_and_our_core_on_four_nodes(slurm):
    res = cli(["--slurm", "--nodes", "4", PY, "-c", MLX_RING], env=env_of(slurm))
    assert res.returncode == 0, res.stderr
    assert by_rank(res.stdout) == sums(4)
    assert re.search(r"Slurm job \d+ RUNNING on node\[1-4\]", res.stderr)
    res = cli(["--slurm", "--nodes", "4", "-n", "2", PY, "-c", OUR_CORE], env=env_of(slurm))
    assert res.returncode == 0, res.stderr
    assert by_rank(res.stdout) == sums(8)


def test_each_rank_runs_on_its_node_with_its_contract(slurm):
    code = ("import json, os, socket; p = os.environ['MLX_HOSTFILE']; print(json.dumps([socket.gethostname(), "
            "os.environ['MLX_RANK'], json.load(open(p)), len(os.environ['MLX_JUPYTER_TOKEN'])]))")
    res = cli(["--slurm", "--nodes", "2", "-n", "2", "-p", "23000", "--output", "raw", PY, "-c", code], env=env_of(slurm))
    assert res.returncode == 0, res.stderr
    rows = sorted(json.loads(line) for line in res.stdout.splitlines())
    plan = [[f"{slurm.addr(1 + r // 2)}:{23000 + r}"] for r in range(4)]
    assert rows == [[f"node{1 + r // 2}", str(r), plan, 32] for r in range(4)]


def test_mpi_backend_ranks_started_by_srun(slurm):
    res = cli(["--slurm", "--nodes", "2", "--backend", "mpi", PY, "-c", MLX_RING.replace("'ring'", "'mpi'")],
              env=env_of(slurm))
    assert res.returncode == 0, res.stderr
    assert by_rank(res.stdout) == sums(2)


def test_secrets_are_in_no_command_line(slurm):
    """The token and --env values reach the ranks through the environment only: no process (srun, the task
    wrappers, the ranks) shows them. (--env KEY passes the launcher's own value on.)"""
    code = "import os, sys; print('token', os.environ['MLX_JUPYTER_TOKEN'], os.environ['API_KEY'], flush=True); sys.stdin.readline()"
    run = LiveCLI(["--slurm", "--nodes", "2", "--env", "API_KEY", PY, "-c", code],
                  env=env_of(slurm, API_KEY="hunter2-secret"))
    try:
        token = run.wait_for(r"token [0-9a-f]{32} hunter2-secret", 2)[0].split()[-2]
        shown = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if token in text or "hunter2-secret" in text:
                shown.append(text[:200])
        assert not shown
    finally:
        run.proc.send_signal(signal.SIGTERM)
        run.finish(20)


def test_pending_then_running(slurm):
    blocker = int(slurm.slurm("sbatch", "--parsable", "--nodes=4", "--exclusive", "--output=/dev/null",
                              "--wrap=sleep 300").stdout.strip())
    run = LiveCLI(["--slurm", "--nodes", "2", PY, "-c", "print('it-ran')"], env=env_of(slurm))
    try:
        line = run.wait_for(r"Slurm job \d+ PENDING \((Resources|Priority)\)")[0]
        assert "RUNNING" not in run.text
        slurm.slurm("scancel", str(blocker))
        run.wait_for(r"Slurm job \d+ RUNNING on node\[1-2\]")
        assert run.finish(30) == 0, run.text
        assert run.text.count("it-ran") == 2
        job = int(re.search(r"Slurm job (\d+)", line).group(1))
        assert wait_until(lambda: job_state(slurm, job) in ("CANCELLED", "COMPLETED"), 10)   # released
    finally:
        slurm.slurm("scancel", str(blocker), check=False)
        if run.proc.poll() is None:
            run.proc.kill()


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_cancel_while_pending_leaves_no_job(slurm, how):
    blocker = int(slurm.slurm("sbatch", "--parsable", "--nodes=4", "--exclusive", "--output=/dev/null",
                              "--wrap=sleep 300").stdout.strip())
    try:
        run = LiveCLI(["--slurm", "--nodes", "4", PY, "-c", "print('must not run')"], env=env_of(slurm))
        run.wait_for(r"Slurm job \d+ PENDING")
        job = job_id_of(run)
        run.proc.send_signal(getattr(signal, how))
        code = run.finish(20)
        assert code == {"SIGINT": 130, "SIGTERM": 143, "SIGKILL": -9}[how], run.text
        if how != "SIGKILL":
            assert f"Slurm job {job} cancelled while PENDING" in run.text
        # the launcher's watchdog scancels it even after a SIGKILL
        assert wait_until(lambda: job_state(slurm, job) == "CANCELLED", 5), jobs(slurm)
    finally:
        slurm.slurm("scancel", str(blocker), check=False)
    assert "must not run" not in run.text


def test_a_step_srun_cannot_create_is_reported(slurm):
    res = cli(["--slurm", "--nodes", "2", "--srun-arg=--cpus-per-task=64", "true"], env=env_of(slurm))
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1].endswith(
        "srun exited with code 1 before rank(s) 0, 1 started: srun: error: Unable to create step for job "
        + re.search(r"Slurm job (\d+)", res.stderr).group(1) + ": More processors requested than permitted")


def test_a_failing_rank_ends_the_step_and_is_named(slurm):
    code = "import os, sys, time; r = int(os.environ['MLX_RANK']); print('up', flush=True); sys.exit(3) if r == 2 else time.sleep(60)"
    t0 = time.monotonic()
    res = cli(["--slurm", "--nodes", "4", PY, "-c", code], env=env_of(slurm), timeout=60)
    assert res.returncode == 3, res.stderr
    assert time.monotonic() - t0 < 20
    summary = res.stderr.strip().splitlines()[-1]
    assert "rank 2 on node3 exited with code 3" in summary
    assert "terminated: rank 0 on node1, rank 1 on node2, rank 3 on node4" in summary
    assert "cancelled" not in summary   # srun's --kill-on-bad-exit, not a scancel


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_launcher_killed_ends_the_job(slurm, sig):
    """SIGTERM: the launcher ends the step and releases the job; SIGKILL: its watchdog does."""
    run = LiveCLI(["--slurm", "--nodes", "4", PY, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                  env=env_of(slurm))
    run.wait_for(r"\[rank \d\] up", 4)
    job = job_id_of(run)
    run.proc.send_signal(sig)
    assert run.finish(10) in ((-9,) if sig == signal.SIGKILL else (128 + signal.SIGTERM, 128 + signal.SIGKILL))
    assert wait_until(lambda: job_state(slurm, job) == "CANCELLED", 5), jobs(slurm)
    assert wait_until(lambda: not any(slurm.net.ns_pids(i) and _ranks_on(slurm, i) for i in range(1, 5)), 10)


def _ranks_on(bed, i: int) -> list[int]:
    """Pids of task processes (not slurmd) on node i."""
    out = []
    for pid in bed.net.ns_pids(i):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"time.sleep(60)" in cmd:
            out.append(pid)
    return out


def test_time_limit_is_reported_naming_job_and_nodes(slurm):
    """--time 1 (a minute); the test then moves the job's end to now (scontrol, as an admin could) so that
    slurmctld's own time-limit check ends it within its 30 s period rather than a minute."""
    run = LiveCLI(["--slurm", "--nodes", "2", "--time", "1", PY, "-c", "import time; print('up', flush=True); time.sleep(100)"],
                  env=env_of(slurm))
    try:
        run.wait_for(r"\[rank \d\] up", 2)
        job = job_id_of(run)
        slurm.slurm("scontrol", "update", f"JobId={job}", "EndTime=now")
        assert run.finish(45) == 143, run.text
        assert f"Slurm job {job} reached its time limit (1 min) on node[1-2]" in run.text, run.text
    finally:
        if run.proc.poll() is None:
            run.proc.kill()


CUT_RANK = """
import numpy as np, sys, time
from mlx_jupyter import distributed as d
g = d.init(backend='ring', strict=True)
g.barrier(timeout=60)
print('ready', flush=True)
if g.rank() == 2:
    time.sleep(100)
d.all_sum(np.ones(4, np.float32))
"""


def test_node_cut_mid_run_fails_within_the_bound_naming_the_node(slurm, tmp_path):
    """node3's cable is pulled while the others wait for it in an all_sum: they fail after the dead-peer
    timeout (2 s), srun ends them, and node3, which cannot answer, is named."""
    script = tmp_path / "cut.py"
    script.write_text(CUT_RANK)
    dead_peer, grace = 2.0, 3.0
    run = LiveCLI(["--slurm", "--nodes", "4", "--env", f"MLX_JUPYTER_DEAD_PEER_TIMEOUT={dead_peer:g}",
                   "--env", f"PYTHONPATH={ROOT}", PY, str(script)], env=env_of(slurm))
    try:
        run.wait_for(r"\[rank \d\] ready", 4)
        job = job_id_of(run)
        slurm.cut(3)
        cut = time.monotonic()
        code = run.finish(30)
        elapsed = time.monotonic() - cut
        assert code == 1, run.text
        # dead-peer timeout, then srun's failure grace, then SIGTERM -> SIGKILL of srun (1 s), plus slack
        assert elapsed < dead_peer + grace + 1 + 4, (elapsed, run.text)
        summary = next(line for line in run.lines if "rank 2 on node3 lost (" in line)
        assert "node3" in summary.split("lost (", 1)[1], run.text
        assert "PeerError" in run.text
        # released: cancelled (still COMPLETING while node3 cannot confirm), or failed once Slurm marks node3 down
        assert wait_until(lambda: job_state(slurm, job) in ("CANCELLED", "COMPLETING", "NODE_FAIL"), 5), jobs(slurm)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
        slurm.heal(3)   # restarts node3's slurmd (its orphaned rank goes with it) and waits until it is idle


def test_inside_an_allocation_and_detached(slurm, tmp_path):
    """--detach submits a batch job that runs the launch inside its allocation (srun from the batch host)."""
    res = cli(["--slurm", "--detach", "--nodes", "2", "--env", "GREETING=hello", PY, "-c",
               "import os; print(os.environ['GREETING'], os.environ['MLX_RANK'], os.environ['SLURM_JOB_ID'])"],
              env=env_of(slurm), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job = int(res.stdout.strip())
    script = slurm.slurm("scontrol", "write", "batch_script", str(job), "-").stdout
    assert "mlx_jupyter launch --slurm" in script and "--env GREETING" in script and "hello" not in script
    assert wait_until(lambda: job_state(slurm, job) in ("COMPLETED", "FAILED"), 30), jobs(slurm)
    assert job_state(slurm, job) == "COMPLETED"
    out = (tmp_path / f"slurm-{job}.out").read_text()
    assert by_rank(out) == {0: f"hello 0 {job}", 1: f"hello 1 {job}"}, out


def test_launcher_api_under_slurm(slurm, monkeypatch):
    from mlx_jupyter.launch import Launcher
    from mlx_jupyter.launch.slurm import SlurmOptions

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    out, on_output = collector()
    exits = []
    launcher = Launcher([PY, "-c", OUR_CORE], slurm=SlurmOptions(nodes=4, on_state=lambda s: None),
                        on_output=on_output, on_exit=lambda r, c: exits.append((r, c))).start()
    assert [(i.rank, i.host, i.state) for i in launcher.ranks] == [(r, f"node{r + 1}", "running") for r in range(4)]
    assert launcher.wait(60) == 0, "\n".join(map(str, out))
    assert {r: line for r, s, line in out if s == "stdout"} == sums(4)
    assert sorted(exits) == [(r, 0) for r in range(4)]
    assert launcher.summary() == ""


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["node", "gpu-a", "cn"]), st.integers(0, 120)), min_size=1, max_size=12,
                unique=True))
def test_hostlists_round_trip_through_scontrol(slurmbed, names):
    """Hostlist expressions are Slurm's to read: what scontrol compresses, hostnames() expands back."""
    from mlx_jupyter.launch.slurm.commands import hostnames

    nodes = [f"{p}{i}" for p, i in names]
    expr = slurmbed.slurm("scontrol", "show", "hostlist", ",".join(nodes)).stdout.strip()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(slurmbed.conf)
    try:
        assert sorted(hostnames(expr)) == sorted(nodes)
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF")
        else:
            os.environ["SLURM_CONF"] = old


def test_ctrl_c_reaches_every_rank(slurm):
    code = ("import time\nprint('up', flush=True)\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n"
            "    print('interrupted', flush=True)")
    run = LiveCLI(["--slurm", "--nodes", "2", PY, "-c", code], env=env_of(slurm))
    run.wait_for(r"\[rank \d\] up", 2)
    run.proc.send_signal(signal.SIGINT)
    assert run.finish(20) == 0, run.text
    assert sorted(line for line in run.lines if "interrupted" in line) == ["[rank 0] interrupted", "[rank 1] interrupted"]


def test_a_reply_streamed_token_by_token_shows_as_it_is_written(slurm, tmp_path_factory):
    """Issue 43 §1 under Slurm: rank 0's ``tok1`` (no newline) is shown before its line ends (slurmstepd alone
    holds a line until its newline), and the rest continues it on the same line."""
    shared = tmp_path_factory.mktemp("stream")
    shared.chmod(0o777)   # the tasks may run as another user
    flag = shared / "go"
    code = ("import os, time\n"
            "if os.environ['MLX_RANK'] == '0':\n"
            "    print('tok1', end='', flush=True)\n"
            "    deadline = time.monotonic() + 30\n"
            f"    while not os.path.exists({str(flag)!r}) and time.monotonic() < deadline:\n"
            "        time.sleep(0.02)\n"
            "    print(' tok2', flush=True)\n")
    run = LiveCLI(["--slurm", "--nodes", "2", PY, "-c", code], env=env_of(slurm))
    try:
        run.wait_until(lambda out: "[rank 0] tok1" in out, stream="stdout", timeout=30)
        assert not flag.exists()
        flag.touch()
        assert run.finish(30) == 0, run.text
        assert "[rank 0] tok1 tok2" in run.streams["stdout"], run.text
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
