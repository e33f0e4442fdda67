"""A vanished host (cable cut: no FIN, no RST) fails the op within the documented dead-peer bound.

Two ranks on two namespace hosts of the test bed; the surviving rank's PeerError is timed
from the moment the other host's link goes down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from ranks import PRELUDE

CODE = """
g = dist.init(strict=True, backend="ring", timeout=60)
g.barrier(timeout=60)
if RANK == 1:
    print("READY", flush=True)
    sys.stdin.readline()  # alive, but never joins the op (until its host vanishes)
    sys.exit(0)
print("ENTERING", flush=True)
try:
    dist.all_sum(np.ones(COUNT, np.float32))
    report(error=None)
except BaseException as exc:
    report(error=type(exc).__name__, message=str(exc), at=time.monotonic())
"""


def _blocked(pid: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/wchan") as fh:
            if "poll" in fh.read():
                return
        time.sleep(0.02)
    raise AssertionError(f"rank 0 never blocked in its op")


# (case, MLX_JUPYTER_DEAD_PEER_TIMEOUT or None for the default 10 s, elements, seconds the peer is
# late before the cut, allowed seconds from cut to PeerError)
CASES = [
    # rank 0 waits to receive: an idle connection, keepalive probes find the host gone
    ("idle", "2", 4, 0, 2 + 1.5),
    # rank 0 is held by a full window of a live peer for twice the bound (must not fail), then
    # the host vanishes: the next unanswered window probe (kernel back-off, here <= 3.2 s) plus the bound
    ("window", "2", 16 << 20, 4, 2 + 5),
    ("idle-default", None, 4, 0, 10 + 1.5),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case,bound,count,late,allowed", CASES, ids=[c[0] for c in CASES])
def test_vanished_host_is_detected_within_the_bound(testbed, tmp_path, case, bound, count, late, allowed) -> None:
    hosts = (3, 4)
    port = 41000 + os.getpid() % 1000
    hostfile = tmp_path / "hostfile.json"
    hostfile.write_text(json.dumps([[f"{testbed.ips[h - 1]}:{port}"] for h in hosts]))
    env = {**os.environ, "MLX_HOSTFILE": str(hostfile), "MLX_JUPYTER_TOKEN": "dead-host-test",
           "MLX_JUPYTER_TRANSPORT": "tcp"}
    env.pop("MLX_JUPYTER_TIMEOUT", None)
    env.pop("MLX_JUPYTER_DEAD_PEER_TIMEOUT", None)
    if bound is not None:
        env["MLX_JUPYTER_DEAD_PEER_TIMEOUT"] = bound
    code = PRELUDE + CODE.replace("COUNT", str(count))
    procs = [subprocess.Popen(["ip", "netns", "exec", testbed.ns(h), sys.executable, "-c", code],
                              env={**env, "MLX_RANK": str(r)}, text=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for r, h in enumerate(hosts)]
    try:
        assert procs[1].stdout.readline().startswith("READY"), procs[1].communicate(timeout=30)
        assert procs[0].stdout.readline().startswith("ENTERING"), procs[0].communicate(timeout=30)
        _blocked(procs[0].pid)
        if late:  # the peer is alive and late: no error, however long the bound has passed
            with pytest.raises(subprocess.TimeoutExpired):
                procs[0].wait(timeout=late)
        cut_at = time.monotonic()
        testbed.cut(hosts[1])
        out, err = procs[0].communicate(timeout=allowed + 30)
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert lines, (out, err)
        info = json.loads(lines[-1][7:])
    finally:
        testbed.heal(hosts[1])
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=10)
    assert info["error"] == "PeerError", info
    assert "stopped responding" in info["message"] and "rank 1" in info["message"], info
    took = info["at"] - cut_at
    print(f"{case}: PeerError {took:.2f} s after the cut")
    assert 0 < took < allowed, (case, took, info)
