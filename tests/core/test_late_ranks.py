"""Late ranks are waited for (no timeout given): a rank busy elsewhere (a checkpoint's write) is normal.

How late is measured against the bounds a wait could wrongly end at: the dead-peer timeout, set to 2 s
here so that a rank LATE (15 s) late is 7 of them late (the default 10 s would need over a minute for
as many), the core's fixed 5 s bounds (a handshake, a peer's answer), and for init() the connect
timeout, of which the late rank takes half (as 60 s of the default 120 would). The scenarios run
concurrently in one test, so the file adds about LATE and the ranks' start to CI."""

from __future__ import annotations

import contextlib

import pytest

from ranks import Ranks

pytestmark = pytest.mark.slow

#: seconds a late rank is late; MLX_JUPYTER_DEAD_PEER_TIMEOUT (s) in every case
LATE = 15
DEAD_PEER = 2

LATE_ALL_SUM = """
LATE = float(os.environ["LATE"])
g = dist.init(strict=True, backend="ring", timeout=60)
x = np.full(16 << 20, RANK + 1, np.float32)  # 64 MiB: far more than the socket buffers and shm ring hold
if RANK == 1:
    time.sleep(LATE)  # the scenario: rank 1 writes a checkpoint while rank 0 is already in all_sum
t0 = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of this host
y = dist.all_sum(x)
report(entered=t0, done=time.monotonic(), exact=bool((y == 3).all()), links=g._core.link_kinds())
"""

# 3 ranks on one host: small all-reduces go through the board, where rank 0 and 2 wait
LATE_SMALL_ALL_SUM = """
LATE = float(os.environ["LATE"])
g = dist.init(strict=True, backend="ring", timeout=60)
dist.all_sum(np.ones(4, np.float32))  # joins the board
if RANK == 1:
    time.sleep(LATE)
t0 = time.monotonic()
y = dist.all_sum(np.full(1024, RANK + 1, np.float32))
report(entered=t0, done=time.monotonic(), exact=bool((y == 6).all()), links=g._core.link_kinds())
"""

# rank 0 sends to rank 2, no ring neighbour of it in 4 ranks: the direct link is set up by this call
LATE_RECV = """
LATE = float(os.environ["LATE"])
g = dist.init(strict=True, backend="ring", timeout=60)
t0 = time.monotonic()
if RANK == 0:
    dist.send(np.arange(2 << 20, dtype=np.int32), 2)
elif RANK == 2:
    time.sleep(LATE)
    t0 = time.monotonic()
    y = dist.recv((2 << 20,), np.int32, 0)
    assert (y == np.arange(2 << 20, dtype=np.int32)).all()
done = time.monotonic()
g.barrier()
report(entered=t0, done=done, links=g._core.link_kinds())
"""

LATE_INIT = """
LATE = float(os.environ["LATE"])
if RANK == 1:
    time.sleep(LATE)  # half MLX_JUPYTER_CONNECT_TIMEOUT (the test sets it)
t0 = time.monotonic()
g = dist.init()
done = time.monotonic()
report(entered=t0, done=done, size=g.size(), total=float(dist.all_sum(np.ones(4), timeout=30)[0]))
"""


@pytest.mark.timeout(300)
def test_late_ranks_are_waited_for() -> None:
    late = {"LATE": str(LATE), "MLX_JUPYTER_DEAD_PEER_TIMEOUT": str(DEAD_PEER)}
    tcp, auto = {**late, "MLX_JUPYTER_TRANSPORT": "tcp"}, {**late, "MLX_JUPYTER_TRANSPORT": "auto"}
    cases = {
        ("all_sum", "tcp"): Ranks(2, LATE_ALL_SUM, env=tcp),
        ("all_sum", "auto"): Ranks(2, LATE_ALL_SUM, env=auto),
        ("recv", "tcp"): Ranks(4, LATE_RECV, env=tcp),
        ("recv", "auto"): Ranks(4, LATE_RECV, env=auto),
        ("init", "tcp"): Ranks(2, LATE_INIT, env={**tcp, "MLX_JUPYTER_CONNECT_TIMEOUT": str(2 * LATE)}),
        ("small", "auto"): Ranks(3, LATE_SMALL_ALL_SUM, env=auto),
    }
    with contextlib.ExitStack() as stack:
        for ranks in cases.values():
            stack.enter_context(ranks).start()
        res = {key: ranks.results(timeout=240) for key, ranks in cases.items()}
    for transport in ("tcp", "auto"):
        kind = "tcp" if transport == "tcp" else "shm"
        r0, r1 = res[("all_sum", transport)]
        assert r0["exact"] and r1["exact"], (transport, r0, r1)
        # rank 0 was in the call long before rank 1 came, and stayed until it did (times from
        # one clock: a loaded machine may start the processes seconds apart)
        assert r1["entered"] - r0["entered"] >= LATE - 4 and r0["done"] >= r1["entered"], (transport, r0, r1)
        assert r0["links"] == [f"right:{kind}", f"left:{kind}"], r0
        ranks_res = res[("recv", transport)]
        sender, receiver = ranks_res[0], ranks_res[2]
        assert receiver["entered"] - sender["entered"] >= LATE - 4 and sender["done"] >= receiver["entered"], \
            (transport, sender, receiver)
        assert f"rank 2:{kind}" in ranks_res[0]["links"], ranks_res[0]
    s0, s1, s2 = res[("small", "auto")]
    assert s0["exact"] and s1["exact"] and s2["exact"] and "board:shm" in s0["links"], (s0, s1, s2)
    for waiting in (s0, s2):
        assert s1["entered"] - waiting["entered"] >= LATE - 4 and waiting["done"] >= s1["entered"], (waiting, s1)
    i0, i1 = res[("init", "tcp")]
    assert i0["size"] == i1["size"] == 2 and i0["total"] == i1["total"] == 2.0, (i0, i1)
    assert i1["entered"] - i0["entered"] >= LATE - 5 and i0["done"] >= i1["entered"], (i0, i1)
