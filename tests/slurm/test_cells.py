"""Cells on a Slurm cluster (``%mlx_cluster start --slurm``) in a real kernel, against real Slurm daemons."""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import time

import psutil
import pytest

from mlx_jupyter.server.manager import ClusterManager
from slurm_helpers import ROOT, wait_until
from tests.cluster.kernel import CellResult, Kernel

pytestmark = pytest.mark.timeout(150)

SUMS = ("%%mlx_distributed\nimport numpy as np, mlx.core as mx, mlx_jupyter.distributed as d\n"
        "ours = [int(v) for v in d.all_sum(np.arange(4, dtype=np.int64) + world.rank())]\n"
        "g = mx.distributed.init(backend='ring', strict=True)\n"
        "theirs = mx.distributed.all_sum(mx.arange(4) + g.rank(), group=g).tolist()\n"
        "print('sums', world.rank(), g.size(), ours, theirs)")


def expected(n: int) -> list[int]:
    return [n * i + n * (n - 1) // 2 for i in range(4)]


def job_state(bed, job: int) -> str:
    return bed.slurm("squeue", "--noheader", "--states=all", f"--jobs={job}", "--format=%T", check=False).stdout.strip()


def live_jobs(bed) -> str:
    return bed.slurm("squeue", "--noheader", "--format=%i %T %j", check=False).stdout.strip()


def text_of(res) -> str:
    shown = [d.get("data", {}).get("text/plain", "") for d in res.displays]
    return "\n".join([res.stdout, res.stderr, res.traceback, *shown])


@pytest.fixture
def kernel(slurm):
    k = Kernel(env={**slurm.env(), "PYTHONPATH": str(ROOT)})
    try:
        assert k.run("%load_ext mlx_jupyter", 30).status == "ok"
        yield k
    finally:
        if k.km.has_kernel:
            k.close()
        else:   # the test shut it down
            k.kc.stop_channels()


def start(k: Kernel, options: str, timeout: float = 60) -> int:
    res = k.run(f"%mlx_cluster start --slurm {options}", timeout)
    assert res.status == "ok", text_of(res)
    return int(re.search(r"Slurm job (\d+) on ", text_of(res)).group(1))


def watch_start(k: Kernel, options: str, until: str, timeout: float = 30) -> tuple[str, str]:
    """Submit a start and read its progress line until it matches ``until``; (msg id, matching text)."""
    msg_id = k.submit(f"%mlx_cluster start --slurm {options}")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = k.kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        text = (msg["content"].get("data") or {}).get("text/plain", "") + msg["content"].get("text", "")
        if re.search(until, text):
            return msg_id, text
    raise AssertionError(f"no progress line matching {until!r} within {timeout} s")


def test_cells_status_and_stop_on_a_slurm_cluster(slurm, kernel):
    job = start(kernel, "--nodes 2 -n 2")
    res = kernel.run(SUMS, 60)
    assert res.status == "ok", text_of(res)
    for r in range(4):
        assert f"sums {r} 4 {expected(4)} {expected(4)}" in res.stdout, res.stdout
    status = kernel.run("%mlx_cluster status", 30)
    listing = asyncio.run(ClusterManager().listing())   # the panel's: the kernel's cluster, from its registry file
    assert [i["slurm"] for i in listing if i.get("slurm")] == [
        {"job_id": job, "nodes": "node[1-2]", "on_failure": "release", "state": "RUNNING", "reason": "",
         "time_left": None, "time_left_text": "unlimited"}], listing
    [item] = [i for i in listing if i.get("slurm")]   # the ranks' nodes as its hosts, ok by the kernel's record
    assert item["hosts"] == ["node1", "node2"], item
    assert [(r["host"], r["health"], r["state"]) for r in item["ranks"]] == [
        ("node1", "ok", "idle"), ("node1", "ok", "idle"), ("node2", "ok", "idle"), ("node2", "ok", "idle")], item
    assert re.search(rf"Slurm job {job} RUNNING on node\[1-2\], unlimited left", status.stdout), text_of(status)
    assert "node1" in text_of(status) and "node2" in text_of(status)   # each rank's host in the table
    assert kernel.run("%mlx_cluster stop", 30).status == "ok"
    assert wait_until(lambda: job_state(slurm, job) in ("CANCELLED", "COMPLETED", ""), 10), job_state(slurm, job)
    assert not live_jobs(slurm)
    job = start(kernel, "--nodes 1")
    kernel.km.shutdown_kernel(now=False)   # a kernel shut down with its cluster running
    assert wait_until(lambda: job_state(slurm, job) in ("CANCELLED", "COMPLETED", ""), 10), job_state(slurm, job)


def test_pending_then_running_and_a_cancel_while_pending(slurm, kernel):
    blocker = int(slurm.slurm("sbatch", "--parsable", "--nodes=4", "--exclusive", "--output=/dev/null",
                              "--wrap=sleep 300").stdout.strip())
    try:
        msg_id, line = watch_start(kernel, "--nodes 2", r"Slurm job \d+ PENDING \((Resources|Priority)\)")
        job = int(re.search(r"Slurm job (\d+)", line).group(1))
        kernel.interrupt()   # the stop button
        res = kernel.collect(msg_id, 30)
        assert res.status == "error"
        assert re.search(rf"Slurm job {job} cancelled while PENDING \((Resources|Priority)\): nothing is left",
                         res.traceback), res.traceback
        assert "KeyboardInterrupt" not in res.traceback
        assert wait_until(lambda: job_state(slurm, job) == "CANCELLED", 5), job_state(slurm, job)
        msg_id, line = watch_start(kernel, "--nodes 2", r"Slurm job \d+ PENDING")
        slurm.slurm("scancel", str(blocker))
        res = kernel.collect(msg_id, 60)
        assert res.status == "ok", text_of(res)
        assert re.search(r"2 ranks ready in .* Slurm job \d+ on node1,node2", text_of(res)), text_of(res)
    finally:
        slurm.slurm("scancel", str(blocker), check=False)
    assert kernel.run("%mlx_cluster stop", 30).status == "ok"


def test_lost_controller_and_killed_kernel_end_the_job(slurm, kernel):
    job = start(kernel, "--nodes 2")
    controller = [p for p in psutil.Process(kernel.pid).children()
                  if "mlx_jupyter.cluster.ipcontroller" in " ".join(p.cmdline())]
    assert len(controller) == 1, controller
    controller[0].kill()
    assert wait_until(lambda: job_state(slurm, job) in ("CANCELLED", "COMPLETED", ""), 10), job_state(slurm, job)
    assert kernel.run("%mlx_cluster stop", 30).status == "ok"
    job = start(kernel, "--nodes 2")
    os.kill(kernel.pid, signal.SIGKILL)
    assert wait_until(lambda: job_state(slurm, job) in ("CANCELLED", "COMPLETED", ""), 10), job_state(slurm, job)
    assert wait_until(lambda: not live_jobs(slurm), 10), live_jobs(slurm)


def wait_printed(k: Kernel, msg_id: str, text: str, ranks: int, timeout: float) -> str:
    """Read the cell's output until each of ``ranks`` ranks printed ``text`` (they are inside the cell's
    code; ``[ranks 0-1] text`` or a line per rank); all of it so far."""
    seen = ""
    deadline = time.monotonic() + timeout

    def labels() -> str:
        return " ".join(line.split("]")[0] for line in seen.splitlines() if line.endswith(f"] {text}"))

    while not all(str(r) in labels() for r in range(ranks)):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"the cell did not print {text!r} within {timeout} s; it printed {seen!r}")
        try:
            msg = k.kc.get_iopub_msg(timeout=min(left, 1))
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            seen += msg["content"]["text"]
        elif msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "error":
            raise AssertionError(f"the cell failed before printing {text!r}: {msg['content']['evalue']}")
    return seen


def test_time_limit_ends_a_running_cell_naming_the_job(slurm, kernel):
    """The test moves the job's end to now, as an admin could (slurmctld checks time limits every 30 s),
    once both ranks run the cell's code: before that they may still be forming their world (slow on a
    loaded machine), and the limit would end the setup, not the cell. --time 10: the job's own limit is
    far from the test's (10 min against the 150 s the test may take)."""
    job = start(kernel, "--nodes 2 --time 10")
    msg_id = kernel.submit("%%mlx_distributed\nimport time\nprint('in the cell', flush=True)\ntime.sleep(100)")
    wait_printed(kernel, msg_id, "in the cell", 2, 60)   # forming the world: seconds, more under load
    slurm.slurm("scontrol", "update", f"JobId={job}", "EndTime=now")
    res = kernel.collect(msg_id, 50)
    assert res.status == "error"
    assert re.search(rf"rank \d .*Slurm job {job} reached its time limit on node[12]", res.traceback), \
        res.traceback
    dead = "import mlx_jupyter.magics as m; print(len(m.current().dead))"
    assert wait_until(lambda: kernel.run(dead, 10).stdout.strip() == "2", 15)   # srun has told of both ends
    res = kernel.run("%%mlx_distributed\nprint(1)", 30)   # the next cell says it again, first
    assert res.status == "error" and "is dead" in res.traceback, res.traceback
    assert re.search(rf"Slurm job {job} reached its time limit on node[12]\n", res.traceback), res.traceback


def test_a_rank_failure_keeps_or_releases_the_allocation(slurm, kernel):
    """--keep-allocation: the job outlives a dead rank and restart reuses it; by default it is released."""
    job = start(kernel, "--nodes 2 --keep-allocation")
    kill = "%%mlx_distributed --targets 1\nimport os, signal\nos.kill(os.getpid(), signal.SIGKILL)"
    res = kernel.run(kill, 30)
    assert res.status == "error" and "rank 1 died" in res.traceback, res.traceback
    assert job_state(slurm, job) == "RUNNING"
    res = kernel.run("%mlx_cluster restart", 60)
    assert res.status == "ok", text_of(res)
    res = kernel.run("%mlx_cluster status", 30)
    assert f"Slurm job {job} RUNNING" in res.stdout, text_of(res)
    res = kernel.run(SUMS, 60)
    assert res.status == "ok" and f"sums 1 2 {expected(2)} {expected(2)}" in res.stdout, text_of(res)
    assert kernel.run("%mlx_cluster stop", 30).status == "ok"

    job = start(kernel, "--nodes 2")
    res = kernel.run(kill, 30)
    assert res.status == "error" and "rank 1 died" in res.traceback, res.traceback
    assert wait_until(lambda: job_state(slurm, job) in ("CANCELLED", "COMPLETED", ""), 10), job_state(slurm, job)
    assert kernel.run("%mlx_cluster stop", 30).status == "ok"


CUT_CELL = """%%mlx_distributed
import numpy as np, pathlib, time, mlx_jupyter.distributed as d
group.barrier(timeout=30)
pathlib.Path({ready!r}, f"ready-{{world.rank()}}").touch()
if world.rank() == 2:
    time.sleep(100)
d.all_sum(np.ones(4, np.float32), group=group)
"""


def test_node_cut_mid_cell_fails_it_within_the_bound_naming_the_node(slurm, kernel, tmp_path):
    """node3's cable is pulled while ranks 0 and 1 wait for rank 2 (on node3) in an all_sum."""
    dead_peer = 2.0
    job = start(kernel, f"--nodes 3 --env MLX_JUPYTER_DEAD_PEER_TIMEOUT={dead_peer:g}")
    try:
        msg_id = kernel.submit(CUT_CELL.format(ready=str(tmp_path)))
        assert wait_until(lambda: len(list(tmp_path.glob("ready-*"))) == 3, 30)
        slurm.cut(3)
        cut = time.monotonic()
        res = kernel.collect(msg_id, 30)
        elapsed = time.monotonic() - cut
        assert res.status == "error"
        assert elapsed < dead_peer + 2 + 3, (elapsed, res.traceback)   # dead peer, the release deadline, slack
        assert "rank 2 on node3 stopped responding" in res.traceback, res.traceback
        assert re.search(r"rank 2: .*lost: node3 stopped responding", res.traceback), res.traceback
        assert kernel.run("%mlx_cluster stop", 30).status == "ok"
        assert wait_until(lambda: job_state(slurm, job) in ("CANCELLED", "COMPLETING", "NODE_FAIL", ""), 10)
    finally:
        slurm.heal(3)


STREAMED = """%%mlx_distributed
import os, time
if world.rank() == 0:
    for token in ("streamed", " tokens"):
        print(token, end="", flush=True)
    deadline = time.monotonic() + 30
    while not os.path.exists({flag!r}) and time.monotonic() < deadline:
        time.sleep(0.02)
    print(" end", os.path.exists({flag!r}))
"""


def test_a_reply_streamed_token_by_token_shows_before_its_newline(slurm, kernel, tmp_path_factory):
    """Issue 43 §1 on a Slurm cluster: a cell's output comes over the cell channel, not srun's output, so
    rank 0's tokens show before its newline; the rank sees the flag the test makes only once they showed."""
    shared = tmp_path_factory.mktemp("stream")
    shared.chmod(0o777)   # the tasks may run as another user
    flag = shared / "go"
    start(kernel, "--nodes 2")
    msg_id = kernel.submit(STREAMED.format(flag=str(flag)))
    res = CellResult()
    deadline = time.monotonic() + 60
    while "[rank 0] streamed tokens" not in res.stdout:
        assert time.monotonic() < deadline, f"no streamed tokens within 60 s: {res.stdout!r}"
        try:
            msg = kernel.kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            assert not res.absorb(msg["msg_type"], msg["content"]), f"the cell ended first: {res}"
    flag.touch()
    while not kernel.drain(msg_id, res):
        assert time.monotonic() < deadline, f"the cell did not end: {res}"
    assert "[rank 0] streamed tokens end True" in res.stdout, res.stdout
    assert kernel.run("%mlx_cluster stop", 60).status == "ok"
