"""Timeouts are honest: inf waits, NaN/negatives are refused, a launched rank never falls back to one rank."""

from __future__ import annotations

import json
import signal
import time

import pytest

from ranks import Ranks
from ranks import run as run_ranks
from test_faults import CTRL_C_BOUND, _wait_blocked

TIMEOUT_VALUES = """
import math
g = dist.init(strict=True, backend="ring", timeout=30)
out = {}
x = np.full(1 << 10, RANK + 1, np.float32)
out["inf"] = float(dist.all_sum(x, timeout=float("inf"))[0])
out["huge"] = float(dist.all_sum(x, timeout=1e300)[0])
out["minus_one"] = float(dist.all_sum(x, timeout=-1)[0])
out["env_default"] = g.default_timeout
out["default_call"] = float(dist.all_sum(x)[0])
bad = {}
for v in (float("nan"), -0.5, -2.0, -float("inf")):
    try:
        dist.all_sum(x, timeout=v)
        bad[repr(v)] = None
    except ValueError as exc:
        bad[repr(v)] = str(exc)
out["bad"] = bad
out["aborted_after_bad"] = g.aborted
# complex max/min: a NaN in either operand wins, as for real numbers
c = np.array([1 + 1j, complex("nan+0j") if RANK == 1 else 5 + 0j], np.complex64)
out["cmax"] = [str(v) for v in dist.all_max(c)]
out["cmin"] = [str(v) for v in dist.all_min(c)]
report(**out)
"""


@pytest.mark.parametrize("env_timeout", ["inf", "1e12"])
def test_infinite_and_huge_timeouts_wait_and_nan_or_negative_are_value_errors(env_timeout: str) -> None:
    res = run_ranks(2, TIMEOUT_VALUES, per_rank_env={r: {"MLX_JUPYTER_TIMEOUT": env_timeout} for r in range(2)})
    for info in res:
        assert info["inf"] == info["huge"] == info["minus_one"] == info["default_call"] == 3.0, info
        assert info["env_default"] == float(env_timeout), info
        for v, msg in info["bad"].items():
            assert msg and "timeout must be >= 0 seconds (or -1 to wait)" in msg, (v, msg)
        assert not info["aborted_after_bad"], info
        assert info["cmax"][1] == info["cmin"][1] == "(nan+0j)", info
        assert info["cmax"][0] == info["cmin"][0] == "(1+1j)", info


def test_environment_timeouts_are_checked() -> None:
    code = """
errors = {}
for name, value in [("MLX_JUPYTER_TIMEOUT", "nan"), ("MLX_JUPYTER_TIMEOUT", "-3"),
                    ("MLX_JUPYTER_CONNECT_TIMEOUT", "soon"), ("MLX_JUPYTER_DEAD_PEER_TIMEOUT", "0")]:
    os.environ[name] = value
    try:
        dist.init(strict=True, backend="ring")
        errors[name + "=" + value] = None
    except ValueError as exc:
        errors[name + "=" + value] = str(exc)
    del os.environ[name]
report(errors=errors)
"""
    with Ranks(1, code) as ranks:
        info = ranks.start().results(60)[0]
    for key, msg in info["errors"].items():
        assert msg and key.split("=")[0] in msg, (key, msg)


def test_a_launched_rank_never_falls_back_to_one_rank_silently() -> None:
    # rank 1 never starts: with MLX_RANK/MLX_HOSTFILE set, init() raises even without strict
    code = """
import warnings
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    try:
        g = dist.init(timeout=1.0)
        report(size=g.size())
    except dist.SetupError as exc:
        report(error="SetupError", message=str(exc))
    except dist.DistributedError as exc:
        report(error=type(exc).__name__, message=str(exc))
"""
    with Ranks(2, code) as ranks:
        ranks.start(only=[0])
        ranks.procs = ranks.procs[:1]
        info = ranks.results(60)[0]
    assert info.get("error") == "SetupError", info
    assert "ring:" in info["message"] and "rank 1" in info["message"], info


def test_a_rank_that_never_starts_is_named_by_every_waiting_rank() -> None:
    # rank 2 of 4 never starts. Rank 1 waits to connect to it, so rank 0, whose link set-up with
    # rank 1 is answered only after that, waits on rank 1: each names the rank it waited for.
    code = """
t0 = time.monotonic()
try:
    # rank 0's deadline comes first: the others are still there, waiting, when it does
    dist.init(strict=True, backend="ring", timeout=3 if RANK == 0 else 6)
    report(error=None)
except dist.DistributedError as exc:
    report(error=type(exc).__name__, message=str(exc), after=time.monotonic() - t0)
"""
    with Ranks(4, code, env={"MLX_JUPYTER_TRANSPORT": "tcp"}) as ranks:
        ranks.start(only=[0, 1, 3])
        ranks.procs = [p for p in ranks.procs if p]
        r0, r1, r3 = ranks.results(60)
    assert r0["error"] == "CommTimeoutError" and "init timed out waiting for rank 1" in r0["message"], r0
    assert "to set up the link" in r0["message"] and "or be waiting on another rank" in r0["message"], r0
    assert r1["error"] == "CommTimeoutError" and "rank 2" in r1["message"] and "timed out" in r1["message"], r1
    assert r3["error"] == "CommTimeoutError" and "rank 2" in r3["message"] and "timed out" in r3["message"], r3
    for info, deadline in ((r0, 3), (r1, 6), (r3, 6)):
        assert deadline <= info["after"] < deadline + 5, info  # plus a loaded machine's slack


def test_ctrl_c_while_setting_up_a_link_raises_keyboard_interrupt() -> None:
    """A send to a non-neighbour whose recv never comes: the link set-up itself is interrupted."""
    code = """
g = dist.init(strict=True, backend="ring", timeout=30)
if RANK != 0:
    sys.stdin.readline()
    report(ok=True); sys.exit(0)
print("ENTERING", flush=True)
try:
    dist.send(np.ones(4, np.float32), 2)
    report(error=None)
except BaseException as exc:
    import traceback
    at = time.monotonic()
    report(error=type(exc).__name__, at=at, inside_op="_core." in (traceback.extract_tb(exc.__traceback__)[-1].line or ""),
           aborted=g.aborted)
"""
    with Ranks(4, code, env={"MLX_JUPYTER_TRANSPORT": "tcp"}) as ranks:
        ranks.start()
        assert ranks.procs[0].stdout.readline().startswith("ENTERING")
        _wait_blocked(ranks.procs[0].pid)
        sent_at = time.monotonic()
        ranks.procs[0].send_signal(signal.SIGINT)
        out, err = ranks.procs[0].communicate(timeout=30)
        for p in ranks.procs[1:]:
            p.stdin.write("go\n")
            p.stdin.flush()
    info = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
    assert info["error"] == "KeyboardInterrupt" and info["inside_op"] and info["aborted"], info
    assert info["at"] - sent_at < CTRL_C_BOUND, info["at"] - sent_at
