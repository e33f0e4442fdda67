"""A rank paused at a debugger's prompt does not make its peers' collectives time out (issue 32, section 2).

3 local ranks. Rank 1 stops at a "prompt" (the debugger's own notice, ``where.sample.set_debugger``, as
``RankPdb`` gives it while it waits for a line) for PAUSE (4 s) right after a barrier; ranks 0 and 2 are blocked
in an ``all_sum`` with a timeout of TIMEOUT (1.5 s). They must not time out: once rank 1 resumes and calls the same
``all_sum``, all three complete with the right sum. Without the notice, the same time away makes ranks 0
and 2 time out at TIMEOUT (and rank 1's late call fails, naming rank 0). Over the board, the shared-memory
ring and TCP: the three launches run side by side (each mostly waits), each judged by its own test.
"""

from __future__ import annotations

import pytest

from ranks import Ranks, results_side_by_side, selected_cases

#: rank 1's time away, and the others' op timeout: away past the timeout with room for the late timeouts the checks
#: below allow (up to TIMEOUT + 2 s); each case waits the pause out, so it is no longer than that
PAUSE = 4.0
TIMEOUT = 1.5

CODE = r"""
import sys
from mlx_jupyter.where import sample
PAUSE, TIMEOUT = float(os.environ["PAUSE"]), float(os.environ["OP_TIMEOUT"])
out = {}
for case in ("paused", "away"):
    g = dist.init(strict=True, backend="ring", timeout=30)
    dist.all_sum(np.ones(4, np.float32), group=g, timeout=30)  # warm-up: joins the board where there is one
    kinds = g._core.link_kinds()
    g.barrier(timeout=30)
    if RANK == 1:
        if case == "paused":
            sample.set_debugger(sys._getframe())  # at a pdb prompt: the debugger says so before it waits
        threading.Event().wait(PAUSE)             # the user reads, types ... (or the rank is busy elsewhere)
        sample.set_debugger(None)
    t0 = time.monotonic()
    try:
        res = ["ok", dist.all_sum(np.full(4, RANK + 1, np.float32), group=g, timeout=TIMEOUT).tolist()]
    except Exception as exc:
        res = [type(exc).__name__, str(exc)]
    out[case] = res + [time.monotonic() - t0, kinds]
    dist.shutdown()
    flag = f"{case}.{RANK}"
    open(flag, "w").close()  # every rank has let go of this world before the next forms
    deadline = time.monotonic() + 60
    for r in range(3):
        while not os.path.exists(f"{case}.{r}"):
            assert time.monotonic() < deadline, "a rank did not finish its case"
            time.sleep(0.005)
report(out=out)
"""

TRANSPORTS = {
    "board": ({}, "board:shm"),
    "shm_ring": ({"MLX_JUPYTER_BOARD": "0"}, "right:shm"),
    "tcp": ({"MLX_JUPYTER_TRANSPORT": "tcp"}, "right:tcp"),
}


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest) -> dict:
    """Each selected transport's ranks' results, or why its launch failed."""
    cases = {transport: Ranks(3, CODE, env={**TRANSPORTS[transport][0], "PAUSE": str(PAUSE), "OP_TIMEOUT": str(TIMEOUT)})
             for (transport,) in selected_cases(request, "test_a_peer_paused_in_the_debugger_suspends_the_timeout",
                                                "transport")}
    return results_side_by_side(cases, timeout=120)


@pytest.mark.timeout(300)  # the shared launch counts against the first case's time
@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_a_peer_paused_in_the_debugger_suspends_the_timeout(transport: str, outcomes) -> None:
    kind = TRANSPORTS[transport][1]
    launched = outcomes[transport]
    if isinstance(launched, AssertionError):
        raise launched
    outs = [r["out"] for r in launched]
    assert all(kind in o["paused"][3] for o in outs), [o["paused"][3] for o in outs]
    paused = [o["paused"] for o in outs]
    # Paused: every rank completes with the sum of 1 + 2 + 3, ranks 0 and 2 after the whole pause.
    assert all(p[0] == "ok" and p[1] == [6.0] * 4 for p in paused), paused
    assert all(paused[r][2] >= PAUSE - 1.0 for r in (0, 2)), paused
    # Away without the notice: ranks 0 and 2 time out at their TIMEOUT (the first to give up may fail the
    # other just before its own deadline: it then names that rank's timeout), rank 1's late call fails.
    away = [o["away"] for o in outs]
    assert "CommTimeoutError" in (away[0][0], away[2][0]), away
    for r in (0, 2):
        assert away[r][0] != "ok" and "timed out" in away[r][1] and TIMEOUT - 0.1 <= away[r][2] < TIMEOUT + 2.0, away
    assert away[1][0] != "ok" and "timed out" in away[1][1], away
