"""Ops from several threads on one group (issue 21, item 7): one op runs at a time; an op that
waits for another thread's op still honours its own timeout, Ctrl-C and abort, and gives up
without touching the group (docs/tips.md, "Threads")."""

from __future__ import annotations

import json
import signal
import sys
import time

import pytest

from ranks import Ranks

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the probes read Linux's /proc")

#: README: Ctrl-C raises KeyboardInterrupt within 0.5 s; the same bound for an abort from another thread
BOUND = 0.5

CODE = r"""
import linecache

def in_core(thread, name, timeout=20):
    # readiness probe: `thread` is inside the core's `name` call (it released the GIL there)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        f = sys._current_frames().get(thread.ident)
        if f is not None and f.f_code.co_name == name and "_core." in linecache.getline(f.f_code.co_filename, f.f_lineno):
            return
        time.sleep(0.005)
    raise AssertionError(f"{thread.name} never entered {name}")

def sleeping_in(thread, word, timeout=20):
    # readiness probe: the thread sleeps in the kernel in `word` (poll: the recv waits for data; futex:
    # the wait for the op lock), three looks in a row 5 ms apart, this probe not holding the GIL
    # between them (a thread that only waited for the GIL has taken it by then)
    deadline, seen = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        time.sleep(0.005)
        with open(f"/proc/self/task/{thread.native_id}/wchan") as fh:
            seen = seen + 1 if word in fh.read() else 0
        if seen == 3:
            return
    raise AssertionError(f"{thread.name} never slept in {word}")

g = dist.init(strict=True, backend="ring", timeout=30)
x = np.ones(4, np.float32)
dist.all_sum(x, timeout=30)
main = threading.main_thread()
if RANK == 1:
    assert sys.stdin.readline() == "send\n"
    dist.send(np.arange(4, dtype=np.float32), 0, timeout=30)
    after = dist.all_sum(x, timeout=30).tolist()
    sys.stdin.readline()   # stay until rank 0 is done (its last recv must not see this rank leave)
    report(after=after)
    sys.exit(0)

out = {}
def receive(key):
    try:
        out[key] = dist.recv(4, "float32", 1, timeout=60).tolist()
    except BaseException as exc:
        out[key] = f"{type(exc).__name__}: {exc}"

# 1. A recv from rank 1 holds the group; the main thread's all_sum waits for it, and times out.
first = threading.Thread(target=receive, args=("first",), name="recv-1")
first.start()
in_core(first, "recv")
sleeping_in(first, "poll")
t0 = time.monotonic()
try:
    dist.all_sum(x, timeout=2)
    out["timeout"] = "no error"
except dist.CommTimeoutError as exc:
    out["timeout"] = str(exc)
out["timeout_took"] = time.monotonic() - t0
out["aborted_after_timeout"] = g.aborted

# 2. Ctrl-C while it waits (the test sends SIGINT once INSIDE and blocked).
def say_inside():
    in_core(main, "all_reduce")
    sleeping_in(main, "futex")
    print("INSIDE", flush=True)
threading.Thread(target=say_inside, daemon=True).start()
try:
    dist.all_sum(x, timeout=30)
    out["ctrl_c"] = "no error"
except KeyboardInterrupt:
    out["ctrl_c"], out["ctrl_c_at"] = "KeyboardInterrupt", time.monotonic()
out["aborted_after_ctrl_c"] = g.aborted

# The recv still completes, and the group works for both ranks.
print("SEND", flush=True)
first.join(30)
out["after"] = dist.all_sum(x, timeout=30).tolist()

# 3. abort() from a third thread while the main thread waits for the op lock.
second = threading.Thread(target=receive, args=("second",), name="recv-2")
second.start()
in_core(second, "recv")
sleeping_in(second, "poll")
def abort_when_blocked():
    in_core(main, "all_reduce")
    sleeping_in(main, "futex")
    out["aborted_at"] = time.monotonic()
    g.abort("stopped from another thread")
aborter = threading.Thread(target=abort_when_blocked, daemon=True)
aborter.start()
try:
    dist.all_sum(x, timeout=30)
    out["abort"] = "no error"
except dist.AbortedError as exc:
    out["abort"], out["abort_seen_at"] = str(exc), time.monotonic()
second.join(10)
# its abort() may still be returning: a thread that comes back from the core (taking the GIL) while the
# interpreter finalizes is ended by CPython 3.11 with a forced unwind, which a C++ frame turns into abort()
aborter.join(10)
report(**out)
"""


def test_an_op_waiting_for_another_threads_op_times_out_is_interrupted_and_aborted():
    with Ranks(2, CODE) as ranks:
        ranks.start()
        r0, r1 = ranks.procs
        line = r0.stdout.readline()
        assert line == "INSIDE\n", line + r0.stderr.read()
        sent_at = time.monotonic()
        r0.send_signal(signal.SIGINT)
        assert r0.stdout.readline() == "SEND\n"
        r1.stdin.write("send\n")
        r1.stdin.flush()
        o0, e0 = r0.communicate(timeout=60)
        r1.stdin.write("exit\n")
        r1.stdin.flush()
        o1, e1 = r1.communicate(timeout=30)
    assert r0.returncode == 0 and r1.returncode == 0, (o0, e0, o1, e1)
    res = json.loads([ln for ln in o0.splitlines() if ln.startswith("RESULT ")][-1][7:])
    # 1. its own timeout: 2 s, not the other op's; the group is left as it was
    assert "timed out waiting for another thread's operation on this group" in res["timeout"], res
    assert 2.0 <= res["timeout_took"] < 2.0 + BOUND and not res["aborted_after_timeout"], res
    # 2. Ctrl-C within the bound; the group goes on
    assert res["ctrl_c"] == "KeyboardInterrupt" and res["ctrl_c_at"] - sent_at < BOUND, (res, sent_at)
    assert not res["aborted_after_ctrl_c"], res
    assert res["first"] == [0.0, 1.0, 2.0, 3.0] and res["after"] == [2.0] * 4, res
    assert json.loads([ln for ln in o1.splitlines() if ln.startswith("RESULT ")][-1][7:]) == {"after": [2.0] * 4}
    # 3. an abort from another thread ends the wait at once, and the pending recv with it
    assert "stopped from another thread" in res["abort"], res
    assert res["abort_seen_at"] - res["aborted_at"] < BOUND, res
    assert res["second"].startswith("AbortedError") and "stopped from another thread" in res["second"], res
