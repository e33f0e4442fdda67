"""An op that failed on one rank completes on no rank (issue 31, section 1).

3 local ranks. Rank 0 enters an op alone and gives up on it at its own timeout; ranks 1 and 2
enter the same op before (rank 1 only), during or after that abort. Every rank must raise, and
the late ranks' error names rank 0 and why it gave up; never may a late rank return the failed
call's data (before the fix, a late all_sum returned 102 = 100 from rank 0 + 1 + 1). In the
"during" case the ranks arrive at rank 0's deadline: then either all complete with the right
result or all fail, never a mix. Every op, over the board, the shared-memory ring (board off)
and TCP, on the main thread and on a second thread. One launch per transport and thread runs all
ops and timings in turn, forming a new world for each (an aborted group stays aborted). The
launches of the selected cases run side by side (each mostly waits out rank 0's timeout, 21
times), so the file takes about one launch's time; each case is judged by its own test.
"""

from __future__ import annotations

import pytest

from ranks import Ranks, results_side_by_side, selected_cases

#: rank 0's timeout in the failing op (seconds): also the trigger of the "during" case. Each launch waits it out
#: 21 times and no verdict depends on its length (the others enter before, at or after it), so it is short.
GIVE_UP = 0.5

CODE = r"""
import os
OPS = ["all_sum", "all_gather", "sum_scatter", "send_recv", "barrier", "split", "sub_all_sum"]
TIMINGS = ["before", "during", "after"]
GIVE_UP = float(os.environ["GIVE_UP"])
LATE = 10  # a late rank's timeout: it must fail long before (rank 0 gave up), never wait it out
THREAD = os.environ["IN_THREAD"] == "1"

def op(name, timing, g, sub, timeout):
    # Rank 0 contributes 100, the others 1: a late rank that sees 102 took the failed call's data.
    mine = np.full(4, 100 if RANK == 0 else 1, np.float32)
    if name == "all_sum":
        return dist.all_sum(mine, group=g, timeout=timeout).tolist()
    if name == "all_gather":
        return dist.all_gather(mine, group=g, timeout=timeout).tolist()
    if name == "sum_scatter":
        return dist.sum_scatter(np.tile(mine, (3, 1)), group=g, timeout=timeout).tolist()
    if name == "send_recv":  # rank 0 waits for rank 1's message; rank 2 for one from rank 0 (never sent)
        if RANK == 1:
            dist.send(mine, dst=0, group=g, timeout=timeout)   # returns its input, as MLX's does: no result
            return None
        if RANK == 2 and timing != "after":
            return "not involved"
        return dist.recv((4,), "float32", src=1 if RANK == 0 else 0, group=g, timeout=timeout).tolist()
    if name == "barrier":
        return g.barrier(timeout=timeout)
    if name == "split":
        return g.split(0, timeout=timeout).size()
    return dist.all_sum(mine, group=sub, timeout=timeout).tolist()

def run(fn):
    # on this thread, or on a second one (bounded wait); returns ("ok", value) or (error type, message)
    box = {}
    def body():
        try:
            box["r"] = ("ok", fn())
        except Exception as exc:
            box["r"] = (type(exc).__name__, str(exc))
    if THREAD:
        t = threading.Thread(target=body)
        t.start()
        t.join(60)
        assert not t.is_alive(), "the op's thread did not end within 60 s"
    else:
        body()
    return box["r"]

def wait_for(path):  # readiness probe: the file rank 0 writes once its op has raised
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"no {path} within 60 s"
        time.sleep(0.005)

out = {}
for name in OPS:
    for timing in TIMINGS:
        key = name + "/" + timing
        g = dist.init(strict=True, backend="ring", timeout=30)
        dist.all_sum(np.ones(4, np.float32), group=g, timeout=30)  # warm-up: joins the board where there is one
        sub = g.split(0, timeout=30)
        dist.all_sum(np.ones(4, np.float32), group=sub, timeout=30)
        kinds = g._core.link_kinds()
        g.barrier(timeout=30)
        flag = key.replace("/", "-") + ".failed"
        if RANK == 0:
            res = run(lambda: op(name, timing, g, sub, GIVE_UP))
            open(flag, "w").close()
        elif timing == "before" and RANK == 1:
            res = run(lambda: op(name, timing, g, sub, LATE))
        elif timing == "during":
            threading.Event().wait(GIVE_UP)  # the trigger: rank 0's own deadline
            res = run(lambda: op(name, timing, g, sub, LATE))
        else:
            wait_for(flag)
            res = run(lambda: op(name, timing, g, sub, LATE))
        out[key] = [res[0], res[1], kinds]
        dist.shutdown()
        open(f"{flag}.{RANK}", "w").close()  # every rank has let go of this world before the next forms
        for r in range(3):
            wait_for(f"{flag}.{r}")
report(out=out)
"""

EXPECTED = {  # what a completed call returns on ranks 0, 1, 2 (the "during" case may complete)
    "all_sum": [[102.0] * 4] * 3,
    "all_gather": [[100.0] * 4 + [1.0] * 8] * 3,
    "sum_scatter": [[[102.0] * 4]] * 3,
    "send_recv": None,  # rank 2 waits for a message nobody sends: never completes everywhere
    "barrier": [None] * 3,
    "split": [3] * 3,
    "sub_all_sum": [[102.0] * 4] * 3,
}

TRANSPORTS = {
    "board": {},
    "shm_ring": {"MLX_JUPYTER_BOARD": "0"},
    "tcp": {"MLX_JUPYTER_TRANSPORT": "tcp"},
}


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest) -> dict:
    """Each selected (transport, thread) case's ranks' results, or why its launch failed."""
    cases = {(transport, thread): Ranks(3, CODE, env={**TRANSPORTS[transport], "GIVE_UP": str(GIVE_UP),
                                                   "IN_THREAD": "1" if thread else "0"})
             for transport, thread in selected_cases(request, "test_an_op_that_failed_on_one_rank_completes_on_none",
                                                     "transport", "thread")}
    return results_side_by_side(cases, timeout=600)


@pytest.mark.timeout(900)  # the shared launch counts against the first case's time
@pytest.mark.parametrize("thread", [False, True], ids=["main_thread", "second_thread"])
@pytest.mark.parametrize("transport", list(TRANSPORTS))
def test_an_op_that_failed_on_one_rank_completes_on_none(transport: str, thread: bool, outcomes) -> None:
    launched = outcomes[(transport, thread)]
    if isinstance(launched, AssertionError):
        raise launched
    outs = [r["out"] for r in launched]
    problems = []
    for key in outs[0]:
        name, timing = key.split("/")
        got = [o[key] for o in outs]
        want_kind = {"board": "board:shm", "shm_ring": "right:shm", "tcp": "right:tcp"}[transport]
        assert want_kind in got[0][2], f"{key}: links {got[0][2]}, wanted {want_kind}"
        problems += _judge(key, name, timing, [g[:2] for g in got])
    assert not problems, "\n".join(problems)


def _judge(key: str, name: str, timing: str, got: list) -> list[str]:
    """What is wrong with the ranks' outcomes [(kind, value or message)] of one scenario."""
    ranks = [0, 1] if name == "send_recv" and timing != "after" else [0, 1, 2]  # rank 2: only "after"
    ok = [got[r][0] == "ok" for r in ranks]
    if name == "send_recv" and timing == "after":  # rank 2 waits for rank 0, which gave up on the group
        ok = ok[:2]
    if all(ok):
        if timing == "after":
            return [f"{key}: completed although rank 0 had given up: {got}"]
        want = EXPECTED[name]
        values = [got[r][1] for r in ranks]
        if name == "send_recv":
            return [] if values == [[1.0] * 4, None] else [f"{key}: wrong data {values}"]
        return [] if values == want else [f"{key}: all completed with wrong results {values}"]
    values = [got[r][1] for r in ranks if got[r][0] == "ok"]
    if any(ok):
        wrong = [v for v in values if v not in (EXPECTED[name] or [[1.0] * 4, None])]
        if wrong:
            return [f"{key}: a rank returned the failed call's data: {got}"]
        # Never a mix, whatever the timing: a rank times out only once every rank it waits for
        # agreed (docs/collective-core.md)
        return [f"{key}: completed on some ranks but failed on others: {got}"]
    problems = []
    if timing != "during" and got[0][0] != "CommTimeoutError":
        problems.append(f"{key}: rank 0 raised {got[0]}, not CommTimeoutError")
    for r in (1, 2):
        if r not in ranks and not (name == "send_recv" and timing == "after"):
            continue
        msg = got[r][1]
        if timing != "during" and not ("rank 0" in msg and "timed out" in msg):
            problems.append(f"{key}: rank {r}'s error does not name rank 0 and its timeout: {got[r]}")
    return problems
