"""What the lab dashboard's feed costs the ranks: their CPU while idle, polled at 1 Hz or not at all.

``python benchmarks/dashboard_feed.py [--ranks 2] [--window 20] [--pairs 4]``: starts a local
cluster through the server's own `ClusterManager` (as the panel's Start does), then alternates
windows of ``--window`` s with nobody asking and with the dashboard's request
(`ClusterManager.dashboard`: status, where samples, the series) once a second, and prints each
window's CPU time of every rank process (user + system, from /proc/<pid>/stat on Linux, psutil
elsewhere) in percent of one core, with the load averages at its start and end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mlx_jupyter.server.manager import ClusterManager  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
HAS_PROC = Path("/proc/self/stat").exists()


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time in seconds, all its threads."""
    if HAS_PROC:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()   # after "pid (comm) "
        return (int(fields[11]) + int(fields[12])) / _TICK   # utime, stime
    import psutil

    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


async def window(manager: ClusterManager, cid: str, pids: list[int], seconds: float, poll: bool) -> dict:
    """One window: each rank's CPU % of one core over ``seconds``, polled at 1 Hz or not."""
    load0 = os.getloadavg()
    before = {p: cpu_seconds(p) for p in pids}
    start = time.monotonic()
    polls, since = 0, None
    while (now := time.monotonic()) - start < seconds:
        if poll:
            got = await manager.dashboard(cid, since)
            polls += 1
            ts = [t for s in (got.get("series") or {}).get("ranks", {}).values() for t in s["t"]]
            since = max(ts) if ts else since
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - now)) if poll else min(1.0, seconds - (now - start)))
    wall = time.monotonic() - start
    after = {p: cpu_seconds(p) for p in pids}
    return {"poll": poll, "polls": polls, "wall": wall, "load": (load0, os.getloadavg()),
            "cpu": {p: 100.0 * (after[p] - before[p]) / wall for p in pids}}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--pairs", type=int, default=4)
    a = ap.parse_args()
    manager = ClusterManager(start_timeout=120)
    entry = await manager.create(n=a.ranks, backend="ring")
    await manager.start(entry)
    cid = entry.cluster.cluster_id
    try:
        if entry.state != "running":
            raise SystemExit(f"the cluster did not start: {entry.error}")
        listing = await manager.dashboard(cid)
        pids = [r["pid"] for r in listing["ranks"]]
        print(f"{a.ranks} local ranks (pids {pids}), windows of {a.window:g} s, {a.pairs} pairs; "
              f"CPU of each rank process in % of one core, from {'/proc/<pid>/stat' if HAS_PROC else 'psutil'}")
        await window(manager, cid, pids, 5.0, False)   # settle after the start (MLX's world forming)
        rows = []
        for i in range(a.pairs):
            for poll in ((False, True) if i % 2 == 0 else (True, False)):   # alternate which goes first
                w = await window(manager, cid, pids, a.window, poll)
                rows.append(w)
                per = " ".join(f"{w['cpu'][p]:.2f}" for p in pids)
                print(f"pair {i + 1} {'1 Hz ' if poll else 'none '} polls={w['polls']:3d} wall={w['wall']:.1f} s "
                      f"rank CPU % = {per}  load {w['load'][0][0]:.2f} -> {w['load'][1][0]:.2f} "
                      f"(5 min {w['load'][1][1]:.2f})")
        idle = [statistics.mean(w["cpu"].values()) for w in rows if not w["poll"]]
        polled = [statistics.mean(w["cpu"].values()) for w in rows if w["poll"]]
        diffs = [p - q for p, q in zip(polled, idle)]
        print(f"mean per rank: not polled {statistics.mean(idle):.3f} %, polled at 1 Hz {statistics.mean(polled):.3f} %; "
              f"the feed's cost {statistics.mean(diffs):.3f} % of a core (pairs: "
              f"{', '.join(f'{d:+.3f}' for d in diffs)}; median {statistics.median(diffs):+.3f})")
    finally:
        await manager.stop(cid)
        manager.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
