"""The core never hangs: dead peers, skipped ops, abort, Ctrl-C, strangers, bad hostfiles."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import socket
import struct
import sys
import threading
import time

import pytest

from ranks import Ranks
from ranks import run as run_ranks

WAIT_IN_OP = """
g = dist.init(strict=True, backend="ring", timeout=30)
dist.all_sum(np.ones(4, np.float32), timeout=30)  # from 3 local ranks on, this joins the board
board = "board:shm" in g._core.link_kinds()
g.barrier(timeout=30)
if RANK == VICTIM:
    sys.stdin.readline()  # alive, but never joins the next op
    report(victim=True)
    sys.exit(0)
t0 = time.monotonic()
try:
    print("ENTERING", flush=True)
    ENTERED = True  # for INSIDE_PROBE: the warm-up all_sum above is not the op it waits for
    dist.all_sum(np.ones(SIZE, np.float32), timeout=TIMEOUT)
    report(error=None)
except BaseException as exc:
    import traceback
    at = time.monotonic()  # the moment the exception arrived (one system-wide clock: compared with the test's)
    inside = "_core." in (traceback.extract_tb(exc.__traceback__)[-1].line or "")  # raised by the core's op itself
    report(error=type(exc).__name__, message=str(exc), elapsed=at - t0, at=at, inside_op=inside, board=board)
"""
#: The op the ranks wait in: the ring's (1 MiB) or, from 3 ranks on one host, the board's (4 KiB).
PATHS = {"ring": 1 << 20, "board": 1024}


def _wait_in_op(victim: int, timeout: str, path: str = "ring") -> str:
    return WAIT_IN_OP.replace("VICTIM", str(victim)).replace("TIMEOUT", timeout).replace("SIZE", str(PATHS[path]))

# Readiness probe: prints INSIDE once the main thread is in the core's op call (it released the GIL),
# the call after the script set ENTERED.
INSIDE_PROBE = """
import linecache
def _inside_probe():
    main = threading.main_thread().ident
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        f = sys._current_frames().get(main)
        if globals().get("ENTERED") and f is not None and f.f_code.co_name == "all_reduce" and "_core." in linecache.getline(f.f_code.co_filename, f.f_lineno):
            print("INSIDE", flush=True)
            return
        time.sleep(0.005)
threading.Thread(target=_inside_probe, daemon=True).start()
"""

#: docs/collective-core.md: "Ctrl-C raises KeyboardInterrupt within 0.5 s" (the core looks every 50 ms)
CTRL_C_BOUND = 0.5


def _wait_blocked(pid: int, timeout: float = 10) -> None:
    """Readiness probe: until the process sleeps in poll() or on a futex (the board) (Linux /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/wchan") as fh:
                wchan = fh.read()
            if "poll" in wchan or "futex" in wchan:
                return
        except OSError:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never blocked")


def _wait_entering(ranks: Ranks, survivors: list[int]) -> None:
    for r in survivors:
        line = ranks.procs[r].stdout.readline()
        assert line.startswith("ENTERING"), line


def _results(ranks: Ranks, survivors: list[int]) -> dict[int, dict]:
    out = {}
    for r in survivors:
        o, e = ranks.procs[r].communicate(timeout=30)
        lines = [ln for ln in o.splitlines() if ln.startswith("RESULT ")]
        assert lines, f"rank {r}: {o}\n{e}"
        out[r] = json.loads(lines[-1][7:])
    return out


KILLED_PEER_CASES = [(n, t, "ring") for n in (2, 3, 4) for t in ("auto", "tcp")] + [(3, "auto", "board"), (4, "auto", "board")]
#: Waits on the ring over both transports, and on the board (the last rank never joins).
WAIT_CASES = [(2, "auto", "ring"), (2, "tcp", "ring"), (3, "auto", "board")]


@pytest.mark.parametrize(("n", "transport", "path"), KILLED_PEER_CASES)
def test_killed_peer_fails_every_rank_within_a_second(n: int, transport: str, path: str) -> None:
    # With 4 ranks, rank 1 is no neighbour of the victim: it hears of the death through the others.
    victim = n - 1
    survivors = list(range(n - 1))
    code = _wait_in_op(victim, "None", path)
    with Ranks(n, code, env={"MLX_JUPYTER_TRANSPORT": transport}) as ranks:
        ranks.start()
        _wait_entering(ranks, survivors)
        for r in survivors:
            _wait_blocked(ranks.procs[r].pid)
        killed_at = time.monotonic()
        ranks.procs[victim].kill()
        res = _results(ranks, survivors)
    for r, info in res.items():
        assert info["error"] == "PeerError" and info["inside_op"], info
        assert info["board"] == (path == "board" or (n >= 3 and transport == "auto")), info
        assert "rank" in info["message"], info
        assert info["at"] - killed_at < 1.0, (r, info["at"] - killed_at, info)


LEAVE_RIGHT_AFTER = """
g = dist.init(strict=True, backend="ring", timeout=30)
failures = []
for i in range(300):
    sub = g.split(0, timeout=30)
    try:
        y = dist.all_sum(np.full(1024, RANK + 1, np.float32), group=sub, timeout=30)
        assert (y == sub.size() * (sub.size() + 1) / 2).all(), y[:4]
        sub.barrier(timeout=30)
    except Exception as e:
        failures.append(f"round {i}: {type(e).__name__}: {e}")
    sub.abort("done with it")  # the peers see this at once, while some are still in the barrier
    g.barrier(timeout=30)
report(failures=failures[:3], count=len(failures))
g.barrier(timeout=30)  # then every process exits: some while others are still in this barrier
"""


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_rank_leaving_right_after_a_collective_fails_no_peer(transport: str) -> None:
    # A rank whose barrier has returned may leave while its peers are still reading its last
    # message: that message must still arrive (shared memory used to report the peer closed).
    res = run_ranks(4, LEAVE_RIGHT_AFTER, timeout=120, env={"MLX_JUPYTER_TRANSPORT": transport})
    for r, info in enumerate(res):
        assert info["count"] == 0, (r, info)


@pytest.mark.parametrize(("n", "transport", "path"), WAIT_CASES)
def test_skipped_op_times_out_naming_the_peer_and_aborts(n: int, transport: str, path: str) -> None:
    victim = n - 1
    code = _wait_in_op(victim, "1.0", path)
    with Ranks(n, code, env={"MLX_JUPYTER_TRANSPORT": transport}) as ranks:
        ranks.start()
        _wait_entering(ranks, [0])
        info = _results(ranks, [0])[0]
        ranks.procs[victim].stdin.write("go\n")
        ranks.procs[victim].stdin.flush()
    assert info["board"] == (path == "board"), info
    assert 0.9 <= info["elapsed"] < 3.0, info
    assert f"rank {victim} (127.0.0.1:" in info["message"], info
    if info["error"] != "CommTimeoutError":
        # From 3 ranks on, another rank waiting for the same victim may time out a moment first: its
        # give-up then releases rank 0, and says that it timed out waiting for the victim.
        assert n >= 3 and info["error"] == "PeerError" and "gave up on this group (rank " in info["message"] \
            and " timed out" in info["message"], info


def test_abort_from_another_thread_fails_pending_and_later_ops() -> None:
    code = """
g = dist.init(strict=True, backend="ring", timeout=30)
if RANK == 1:
    sys.stdin.readline()
    report(ok=True); sys.exit(0)
threading.Timer(0.3, g.abort, args=("stopped by test",)).start()
t0 = time.monotonic()
errors = []
for _ in range(2):
    try:
        dist.all_sum(np.ones(10), timeout=20)
    except dist.AbortedError as exc:
        errors.append(str(exc))
report(errors=errors, elapsed=time.monotonic() - t0)
"""
    with Ranks(2, code) as ranks:
        ranks.start()
        info = _results(ranks, [0])[0]
        ranks.procs[1].stdin.write("go\n")
        ranks.procs[1].stdin.flush()
    assert len(info["errors"]) == 2 and all("stopped by test" in e for e in info["errors"]), info
    assert info["elapsed"] < 5


@pytest.mark.parametrize(("n", "transport", "path"), WAIT_CASES)
def test_ctrl_c_in_a_blocked_op_raises_keyboard_interrupt(n: int, transport: str, path: str) -> None:
    victim = n - 1
    code = INSIDE_PROBE + _wait_in_op(victim, "None", path)
    with Ranks(n, code, env={"MLX_JUPYTER_TRANSPORT": transport}) as ranks:
        ranks.start()
        _wait_entering(ranks, list(range(n - 1)))
        assert ranks.procs[0].stdout.readline().startswith("INSIDE")
        _wait_blocked(ranks.procs[0].pid)
        sent_at = time.monotonic()
        ranks.procs[0].send_signal(signal.SIGINT)
        res = _results(ranks, list(range(n - 1)))
        ranks.procs[victim].stdin.write("go\n")
        ranks.procs[victim].stdin.flush()
    info = res[0]
    assert info["error"] == "KeyboardInterrupt" and info["inside_op"] and info["board"] == (path == "board"), info
    assert info["at"] - sent_at < CTRL_C_BOUND, info["at"] - sent_at
    # The other ranks waiting with it learn at once that rank 0 gave up, and why.
    for r in range(1, n - 1):
        assert res[r]["error"] == "PeerError" and "rank 0" in res[r]["message"], res[r]
        assert "interrupted" in res[r]["message"] and res[r]["at"] - sent_at < 1.0, res[r]


@pytest.mark.parametrize(("n", "transport", "path"), WAIT_CASES)
def test_blocked_rank_uses_no_cpu(n: int, transport: str, path: str) -> None:
    # The whole process's CPU time (all threads) over the 2 s the op waits.
    code = """
g = dist.init(strict=True, backend="ring", timeout=30)
x = np.ones(4)
dist.all_sum(x, timeout=30)  # from 3 local ranks on, this joins the board
board = "board:shm" in g._core.link_kinds()
if RANK == VICTIM:
    sys.stdin.readline(); report(ok=True); sys.exit(0)
t0 = time.monotonic(); c0 = time.process_time()
try:
    dist.all_sum(x, timeout=2.0)
except dist.CommTimeoutError:
    pass
report(cpu=time.process_time() - c0, wall=time.monotonic() - t0, board=board)
""".replace("VICTIM", str(n - 1))
    with Ranks(n, code, env={"MLX_JUPYTER_TRANSPORT": transport}) as ranks:
        ranks.start()
        res = _results(ranks, list(range(n - 1)))
        ranks.procs[n - 1].stdin.write("go\n")
        ranks.procs[n - 1].stdin.flush()
    for info in res.values():
        assert info["board"] == (path == "board") and info["wall"] >= 1.9, info
        assert info["cpu"] <= 0.03 * info["wall"], info  # at most 3% of a core (measured: ~0.3%)


def test_strangers_are_refused_and_the_job_goes_on() -> None:
    code = """
g = dist.init(strict=True, backend="ring", timeout=3 if os.environ.get("STRANGER") else 60)
report(sum=dist.all_sum(np.arange(1000, dtype=np.int64) * (RANK + 1)).tolist()[:3])
"""
    with Ranks(2, code) as ranks:
        ranks.start(only=[0])
        port0 = ranks.ports[0] + 1000
        # A stranger that sends garbage, and one that says nothing and hangs up.
        deadline = time.monotonic() + 30
        while True:
            try:
                s = socket.create_connection(("127.0.0.1", port0), timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, "rank 0 never listened"
                time.sleep(0.05)  # readiness probe for rank 0's listener
        s.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 100)
        s.close()
        socket.create_connection(("127.0.0.1", port0), timeout=5).close()
        # A process of another job (other token) posing as rank 1.
        ranks.per_rank_env[1] = {"MLX_JUPYTER_TOKEN": "another-job", "STRANGER": "1"}
        ranks.start(only=[1])
        _, stranger_err = ranks.procs[1].communicate(timeout=30)
        code1 = ranks.procs[1].returncode
        del ranks.per_rank_env[1]
        ranks.start(only=[1])  # the real rank 1
        finished = ranks.finish(timeout=90)
    results = [json.loads([ln for ln in o.splitlines() if ln.startswith("RESULT ")][-1][7:]) for _, o, _ in finished]
    assert results[0]["sum"] == results[1]["sum"] == [0, 3, 6]
    assert code1 != 0 and "MLX_JUPYTER_TOKEN differs" in stranger_err, stranger_err
    log0 = finished[0][2]
    assert "refused a connection from 127.0.0.1" in log0 and "authentication failed" in log0, log0
    assert "bad greeting" in log0, log0


def test_malformed_hostfiles_give_clear_errors(tmp_path) -> None:
    from mlx_jupyter.vocab.rank_env import RankEnvError, load_ring, read

    def read_ring_env(env):
        return load_ring(read(env))

    good = tmp_path / "good.json"
    good.write_text('[["127.0.0.1:5000"], ["127.0.0.1:5001"]]')
    cases = {
        "missing": ({"MLX_RANK": "0", "MLX_HOSTFILE": str(tmp_path / "nope.json")}, "cannot read the hostfile"),
        "bad json": ({"MLX_RANK": "0", "MLX_HOSTFILE": str(_write(tmp_path, "b.json", "[[oops"))}, "not valid JSON"),
        "bad address": ({"MLX_RANK": "0", "MLX_HOSTFILE": str(_write(tmp_path, "c.json", '[["10.0.0.1"]]'))}, "is not ip:port"),
        "bad port": ({"MLX_RANK": "0", "MLX_HOSTFILE": str(_write(tmp_path, "d.json", '[["10.0.0.1:99999"]]'))}, "1..65535"),
        "rank out of range": ({"MLX_RANK": "2", "MLX_HOSTFILE": str(good)}, "out of range"),
        "rank not int": ({"MLX_RANK": "x", "MLX_HOSTFILE": str(good)}, "not an integer"),
        "no rank": ({"MLX_HOSTFILE": str(good)}, "MLX_RANK is not"),
        "empty list": ({"MLX_RANK": "0", "MLX_HOSTFILE": str(_write(tmp_path, "e.json", "[]"))}, "non-empty"),
    }
    for name, (env, needle) in cases.items():
        with pytest.raises(RankEnvError) as info:
            read_ring_env(env)
        assert needle in str(info.value), (name, str(info.value))
        if name != "no rank" and name != "rank not int":
            assert env["MLX_HOSTFILE"] in str(info.value), (name, str(info.value))
    env = read_ring_env({"MLX_RANK": "1", "MLX_HOSTFILE": str(good)})
    assert env.rank == 1 and env.addresses == [[("127.0.0.1", 6000)], [("127.0.0.1", 6001)]]


def _write(d, name: str, text: str):
    p = d / name
    p.write_text(text)
    return p


def test_init_names_valid_backends() -> None:
    from mlx_jupyter import distributed as dist

    with pytest.raises(ValueError, match="valid names are any, ring, jaccl, jaccl-ring, nccl, mpi"):
        dist.init(backend="gloo")
    assert dist.is_available("ring") and not dist.is_available("gloo")
    assert {b["name"] for b in dist.backends()} == {"ring", "jaccl", "jaccl-ring", "nccl", "mpi"}
    for b in dist.backends():   # an available backend needs no fix; a missing one says what to do and why
        assert b["available"] == (b["fix"] == "") and b["detail"], b


SHM_LOOP = """
g = dist.init(strict=True, backend="ring", timeout=30)
dist.all_sum(np.ones(4, np.float32))  # joins the board: one more segment, shared by all three
assert sorted(g._core.link_kinds()) == ["board:shm", "left:shm", "right:shm"], g._core.link_kinds()
print("ENTERING", flush=True)
try:
    while True:
        dist.all_sum(np.ones(1 << 20, np.float32))
        dist.all_sum(np.ones(1024, np.float32))
except dist.DistributedError as exc:
    print("FAILED " + type(exc).__name__, flush=True)
    sys.stdin.readline()  # alive while the test looks at what this process still holds
"""


def _segments_of(pid: int) -> tuple[list[str], list[str]]:
    """The mappings and open descriptors of our segments in process `pid` (Linux /proc)."""
    ours = ("memfd:mlx_jupyter", "/mlxj.")
    with open(f"/proc/{pid}/maps") as fh:
        maps = [ln.split(None, 5)[-1].strip() for ln in fh if any(o in ln for o in ours)]
    fds = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if any(o in target for o in ours):
            fds.append(target)
    return maps, fds


def _our_shm_names() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("mlxj.")} if os.path.isdir("/dev/shm") else set()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inspects /proc/<pid>/maps and /dev/shm")
@pytest.mark.parametrize("mechanism", ["memfd", "named"])
def test_no_shared_memory_left_after_sigkill(mechanism: str) -> None:
    # "named" is the macOS mechanism (POSIX shm objects), run on Linux.
    env = {"MLX_JUPYTER_SHM": "named"} if mechanism == "named" else {}
    mark = "/memfd:mlx_jupyter" if mechanism == "memfd" else f"/dev/shm/mlxj.{os.geteuid()}."
    before = _our_shm_names()
    with Ranks(3, SHM_LOOP, env=env) as ranks:
        ranks.start()
        _wait_entering(ranks, [0, 1, 2])
        for r, p in enumerate(ranks.procs):
            maps, fds = _segments_of(p.pid)
            # each rank maps the segments of its two links and the board (so the probe sees
            # them), and creators closed their descriptors once the peers had mapped them
            assert len(maps) == 3 and all(m.startswith(mark) for m in maps), (r, maps)
            assert fds == [], (r, fds)
        assert _our_shm_names() == before  # a name exists only during a handover
        ranks.procs[2].kill()
        for r in (0, 1):
            line = ranks.procs[r].stdout.readline()
            assert line.startswith("FAILED PeerError"), (r, line)
            # the survivors' failed group has unmapped its segments
            assert _segments_of(ranks.procs[r].pid) == ([], []), (r, _segments_of(ranks.procs[r].pid))
        ranks.procs[2].wait(timeout=10)
    assert _our_shm_names() == before


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm to plant named objects")
def test_stale_named_segments_are_removed_by_the_next_run() -> None:
    """A creator killed before its peer opened the name leaves it behind: the next run removes
    it (its creator is gone), and leaves alone names of live processes and foreign objects."""
    import subprocess

    magic = 0x4D4C584A53484D31
    gone = subprocess.Popen(["true"])
    gone.wait()

    def layout(pid: int, m: int = magic) -> bytes:  # magic, ring bytes, nonce, creator pid; 576 bytes in all
        return struct.pack("<QQQq", m, 4 << 20, 1, pid) + bytes(576 - 32)

    planted = {"stale": (61, layout(gone.pid)), "live": (62, layout(os.getpid())), "foreign": (63, layout(gone.pid, 7))}
    paths = {k: f"/dev/shm/mlxj.{os.geteuid()}.{slot}" for k, (slot, _) in planted.items()}
    for k, (_, data) in planted.items():
        with open(paths[k], "wb") as fh:
            fh.write(data)
        os.chmod(paths[k], 0o600)
    try:
        code = """
g = dist.init(strict=True, backend="ring", timeout=30)
assert dist.all_sum(np.ones(3), timeout=30).tolist() == [2.0] * 3
report(links=g._core.link_kinds())
"""
        res = run_ranks(2, code, env={"MLX_JUPYTER_SHM": "named"})
        assert all(k.endswith(":shm") for r in res for k in r["links"]), res
        assert not os.path.exists(paths["stale"])
        assert os.path.exists(paths["live"]) and os.path.exists(paths["foreign"])
    finally:
        for p in paths.values():
            if os.path.exists(p):
                os.unlink(p)


def test_reforming_while_a_peer_holds_the_old_group() -> None:
    code = """
g = dist.init(strict=True, timeout=30)
dist.all_sum(np.ones(3), timeout=30)
old_error = None
if RANK == 0:
    g.abort("test re-forms the group")
else:
    sys.stdin.readline()  # the old group, untouched, until rank 0 is knocking with a new one
    try:
        dist.all_sum(np.ones(3), timeout=5)
    except dist.DistributedError as exc:
        old_error = type(exc).__name__
new = dist.init(strict=True, timeout=30)
assert new is not g
report(sum=dist.all_sum(np.ones(3) * (RANK + 1), timeout=30).tolist(), old_error=old_error)
"""
    with Ranks(2, code) as ranks:
        ranks.start()
        line = ranks.procs[1].stderr.readline()
        assert "forming a new group" in line, line
        ranks.procs[1].stdin.write("go\n")
        ranks.procs[1].stdin.flush()
        res = ranks.results(timeout=60)
    assert res[0]["sum"] == res[1]["sum"] == [3.0, 3.0, 3.0]
    assert res[1]["old_error"] == "AbortedError", res[1]


@pytest.mark.parametrize(("n", "transport"), [(2, "auto"), (2, "tcp"), (3, "auto")])
def test_mismatched_calls_fail_clearly_on_every_rank(n: int, transport: str) -> None:
    # With 3 local ranks small all-reduces go through the board: a rank whose call differs
    # is caught there ("op", "size") or, when it took the ring instead ("path"), by the
    # message it sends its neighbours. No timeout: a missed mismatch would hang the test.
    code = """
def fresh():
    g = dist.init(strict=True, backend="ring", timeout=30)  # re-form after the abort
    dist.all_sum(np.ones(4, np.float32), timeout=30)  # from 3 local ranks on, joins the board
    return g
g = fresh()
board = "board:shm" in g._core.link_kinds()
errors = []
for case in ("op", "size", "path", "gather"):
    try:
        if case == "op":
            (dist.all_sum if RANK == 0 else dist.all_max)(np.ones(4, np.float32))
        elif case == "gather":
            (dist.all_gather if RANK == 0 else dist.all_sum)(np.ones(4, np.float32))
        elif case == "size":
            dist.all_sum(np.ones(4 + RANK, np.float32))
        else:
            dist.all_sum(np.ones(16 if RANK == 0 else 1 << 16, np.float32))
    except dist.DistributedError as exc:
        errors.append((type(exc).__name__, str(exc)))
    g = fresh()
report(errors=errors, board=board)
"""
    res = run_ranks(n, code, timeout=60, env={"MLX_JUPYTER_TRANSPORT": transport})
    for r, info in enumerate(res):
        assert len(info["errors"]) == 4 and info["board"] == (n >= 3 and transport == "auto"), info
        # the rank that does not see the mismatch itself sees its peer go: the connection
        # ends (PeerError), or the peer already re-forms (AbortedError, "left this group")
        for kind, message in info["errors"]:
            assert kind in ("MismatchError", "PeerError") or (kind == "AbortedError" and "left this group" in message), info
    # At least one rank sees the mismatch itself and names both calls; the others may see the abort.
    firsts = [info["errors"][0] for info in res]
    assert any(k == "MismatchError" and "all_max" in m and "all_sum" in m for k, m in firsts), firsts
    seconds = [info["errors"][1] for info in res]
    sizes = [f"{4 * (4 + r)} bytes" for r in range(n)]   # rank r sends 4 + r floats: any two of them differ
    assert any(k == "MismatchError" and sum(size in m for size in sizes) == 2 for k, m in seconds), seconds
    thirds = [info["errors"][2] for info in res]
    assert any(k == "MismatchError" and "64 bytes" in m and "262144 bytes" in m for k, m in thirds), thirds
    fourths = [info["errors"][3] for info in res]
    assert any(k == "MismatchError" and "all_gather" in m and "all_sum" in m for k, m in fourths), fourths


class _FakePeer:
    """Rank 1 of a 2-rank world played by the test: it completes the handshakes and
    link setup (shared memory towards rank 0's right link, TCP back), then can
    ring rank 0's doorbell without ever sending data."""

    MAGIC = b"MLXJHS01"
    LINK = struct.pack("<I", 0x4D4A4C4B)

    def __init__(self, ranks: Ranks) -> None:
        self.ranks = ranks
        self.listener = socket.create_server(("127.0.0.1", ranks.ports[1] + 1000))
        self.listener.settimeout(30)
        self.socks = [self.listener]

    def _mac(self, role: bytes, ni: bytes, na: bytes, header: bytes = b"") -> bytes:
        return hmac.new(self.ranks.token.encode(), role + ni + na + header, hashlib.sha256).digest()

    @staticmethod
    def _read(s: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = s.recv(n - len(data))
            assert chunk, "rank 0 hung up during setup"
            data += chunk
        return data

    def _accept(self) -> socket.socket:
        s, _ = self.listener.accept()
        s.settimeout(30)
        hello = self._read(s, 40)
        assert hello[:8] == self.MAGIC
        na = os.urandom(32)
        s.sendall(self.MAGIC + na + self._mac(b"A", hello[8:], na))
        self._read(s, 24 + 32)
        s.sendall(b"\x01")
        return s

    def _connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.ranks.ports[0] + 1000), timeout=30)
        ni = os.urandom(32)
        s.sendall(self.MAGIC + ni)
        reply = self._read(s, 72)
        header = struct.pack("<QIIII", 1, 1, 1, 0, 2)  # group 1, initiator 1, ring, index 0, world of 2
        s.sendall(header + self._mac(b"I", ni, reply[8:40], header))
        assert self._read(s, 1) == b"\x01"
        return s

    def join(self) -> socket.socket:
        """Plays rank 1 until rank 0's group is formed; returns rank 0's shared-memory doorbell."""
        bell = self._accept()
        back = self._connect()
        self._read(bell, 40)  # rank 0's offer: yes to shared memory
        bell.sendall(self.LINK + struct.pack("<I", 1))
        self._read(bell, 112)  # the segment: never mapped, it is the doorbell that matters
        bell.sendall(self.LINK + struct.pack("<I", 1))
        back.sendall(self.LINK + struct.pack("<I", 0) + bytes(32))  # TCP back to us
        self._read(back, 8)
        self.socks = [self.listener, bell, back]
        return bell

    def close(self) -> None:
        for s in self.socks:
            s.close()


def test_ctrl_c_is_noticed_while_the_doorbell_keeps_ringing() -> None:
    """poll() keeps returning at once (doorbell bytes, no data): Ctrl-C still gets through."""
    code = INSIDE_PROBE + """
g = dist.init(strict=True, backend="ring", timeout=30)
assert g._core.link_kinds() == ["right:shm", "left:tcp"], g._core.link_kinds()
print("ENTERING", flush=True)
ENTERED = True
try:
    dist.all_sum(np.ones(4, np.float32))
    report(error=None)
except BaseException as exc:
    import traceback
    at = time.monotonic()
    report(error=type(exc).__name__, at=at, inside_op="_core." in (traceback.extract_tb(exc.__traceback__)[-1].line or ""))
"""
    with Ranks(2, code) as ranks:
        ranks.start(only=[])
        peer = _FakePeer(ranks)
        ranks.start(only=[0])
        bell = peer.join()
        _wait_entering(ranks, [0])

        def ring() -> None:  # keeps the doorbell's socket full until rank 0 hangs up
            try:
                while True:
                    bell.sendall(b"\x01" * 65536)
            except OSError:
                pass

        ringer = threading.Thread(target=ring, daemon=True)
        ringer.start()
        try:
            # rank 0 is in its op now (its poll() returning at once again and again)
            assert ranks.procs[0].stdout.readline().startswith("INSIDE")
            t0 = time.monotonic()
            ranks.procs[0].send_signal(signal.SIGINT)
            info = _results(ranks, [0])[0]
        finally:
            ranks.kill()
            ringer.join(timeout=10)
            peer.close()
    assert info["error"] == "KeyboardInterrupt" and info["inside_op"], info
    assert info["at"] - t0 < CTRL_C_BOUND, info["at"] - t0
