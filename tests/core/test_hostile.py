"""Hostile peers: connection floods, a listener that fails authentication, a corrupted shared segment, no token."""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time

import psutil
import pytest

from needs import require
from mlx_jupyter.collective.auth_warning import is_loopback, needs_warning
from mlx_jupyter.vocab.rank_env import RankEnv
from mlx_jupyter.vocab.hosts import split_addr
from ranks import PRELUDE, Ranks

GREETING = b"MLXJHS01"


def _raise_own_fd_limit(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= want:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
    except (ValueError, OSError):
        pytest.skip(f"cannot raise this process's RLIMIT_NOFILE to {want} (hard limit {hard})")


def _read_tagged(proc: subprocess.Popen, tag: str) -> str:
    for line in proc.stdout:
        if line.startswith(tag):
            return line[len(tag):].strip()
    raise AssertionError(f"rank exited before printing {tag!r}: {proc.stderr.read()}")


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


FLOOD_RANK = """
import resource
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (1024, min(1024, hard) if hard > 0 else 1024))
g = dist.init(strict=True, backend="ring", timeout=60)
if os.environ.get("TIGHT"):  # a few descriptors to spare: the acceptor runs into EMFILE
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 6, 1024))
print("READY", flush=True)
ok = True
for i in range(30):
    sys.stdin.readline()
    x = dist.all_sum(np.arange(1000, dtype=np.int64) * (RANK + 1) + i, timeout=60)
    ok = ok and x.tolist() == (np.arange(1000, dtype=np.int64) * 3 + 2 * i).tolist()
report(ok=ok)
sys.stdin.readline()  # alive while the strangers stay connected
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("limit", ["1024", pytest.param("tight", marks=pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="counts descriptors in /proc/self/fd"))])
def test_connection_flood_neither_kills_nor_spins_a_rank(limit: str) -> None:
    _raise_own_fd_limit(8192)
    with Ranks(2, FLOOD_RANK, env={"TIGHT": "1"} if limit == "tight" else {}) as ranks:
        ranks.start()
        for p in ranks.procs:
            _read_tagged(p, "READY")
        rank0 = psutil.Process(ranks.procs[0].pid)
        port = ranks.ports[0] + 1000
        strangers: list[socket.socket] = []
        cpu0, t0 = _cpu(rank0), time.monotonic()
        try:
            for k in range(3000):
                s = socket.socket()
                s.settimeout(10)
                s.connect(("127.0.0.1", port))  # a full backlog only delays the SYN: bounded by the timeout
                strangers.append(s)
                try:
                    s.send(GREETING if k % 2 == 0 else b"\x00" + os.urandom(63))
                except OSError:
                    pass  # the rank may already have refused it
                if k % 100 == 99:
                    for p in ranks.procs:
                        p.stdin.write("go\n")
                        p.stdin.flush()
            results = [json.loads(_read_tagged(p, "RESULT ")) for p in ranks.procs]
            # The window covers the flood, the ops, and the silent strangers' 5 s handshake deadline.
            time.sleep(max(0.0, t0 + 6 - time.monotonic()))  # a measurement window, not a synchronisation
            flood_cpu, flood_wall = _cpu(rank0) - cpu0, time.monotonic() - t0
            # Held open, idle: a rank out of slots or descriptors must sleep, not spin.
            cpu1, t1 = _cpu(rank0), time.monotonic()
            time.sleep(2)  # a measurement window, not a synchronisation
            idle_cpu, idle_wall = _cpu(rank0) - cpu1, time.monotonic() - t1
            assert all(p.poll() is None for p in ranks.procs), "a rank died during the flood"
        finally:
            for s in strangers:
                s.close()
        for p in ranks.procs:
            p.stdin.write("bye\n")
            p.stdin.flush()
        finished = ranks.finish(timeout=60)
    assert results == [{"ok": True}, {"ok": True}], results
    assert [code for code, _, _ in finished] == [0, 0], finished
    assert flood_cpu < 0.5 * flood_wall, (flood_cpu, flood_wall)
    assert idle_cpu < 0.1 * idle_wall, (idle_cpu, idle_wall)
    log0 = finished[0][2]
    assert "bad greeting" in log0 and "terminate" not in log0, log0


def test_dialer_never_reveals_its_proof_to_a_listener_that_failed_its_own() -> None:
    code = """
try:
    dist.init(strict=True, backend="ring", timeout=3)
    report(error=None)
except dist.DistributedError as exc:
    report(error=type(exc).__name__, message=str(exc))
"""
    received: list[bytes] = []
    with Ranks(2, code) as ranks:
        ranks.start(only=[])  # just the hostfile and ports: rank 1's address is our impostor
        fake = socket.create_server(("127.0.0.1", ranks.ports[1] + 1000))
        fake.settimeout(1)
        stop = threading.Event()

        def impostor() -> None:
            while not stop.is_set():
                try:
                    c, _ = fake.accept()
                except OSError:
                    continue
                with c:
                    c.settimeout(5)
                    got = b""
                    while len(got) < 40:
                        chunk = c.recv(40 - len(got))
                        if not chunk:
                            break
                        got += chunk
                    # our greeting and a nonce, but a proof made without the job's token
                    c.sendall(GREETING + os.urandom(32) + os.urandom(32))
                    rest = b""
                    try:
                        while chunk := c.recv(4096):
                            rest += chunk
                    except OSError:
                        pass
                    received.append(rest)

        t = threading.Thread(target=impostor, daemon=True)
        t.start()
        try:
            ranks.start(only=[0])
            code0, out, err = ranks.procs[0].wait(timeout=60), *ranks.procs[0].communicate(timeout=30)
        finally:
            stop.set()
            t.join(timeout=10)
            fake.close()
    result = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
    assert code0 == 0 and result["error"], (out, err)
    assert "failed authentication" in result["message"] or "failed authentication" in err, (result, err)
    assert received, "rank 0 never dialed the impostor"
    assert all(r == b"" for r in received), received  # not one byte of its MAC


SHM_JOB = """
g = dist.init(strict=True, backend="ring", timeout=30)
assert all(k.endswith(":shm") for k in g._core.link_kinds()), g._core.link_kinds()
print("READY", flush=True)
try:
    while True:
        dist.all_sum(np.ones(1 << 16, np.float32), timeout=30)
except dist.DistributedError as exc:
    report(error=type(exc).__name__, message=str(exc))
"""


def _segment_range(pid: int, board: bool = False) -> tuple[int, int]:
    """The first link segment (8 MiB of rings) or the board (under 1 MiB for a few ranks) mapped in `pid`."""
    with open(f"/proc/{pid}/maps") as fh:
        for ln in fh:
            if "memfd:mlx_jupyter" in ln:
                lo, hi = (int(v, 16) for v in ln.split()[0].split("-"))
                if (hi - lo < 1 << 20) == board:
                    return lo, hi
    raise AssertionError(f"no shared segment mapped in process {pid}")


def _scribble_until_a_rank_fails(n: int, job: str, garbage: dict[int, bytes], board: bool) -> list[str]:
    """Runs `job` on n ranks and writes `garbage` (offset: bytes) into rank 0's link segment
    or board until a rank gives up; every rank must end with a PeerError, not a crash.
    Returns their messages."""
    with Ranks(n, job) as ranks:
        ranks.start()
        for p in ranks.procs:
            _read_tagged(p, "READY")
        pid = ranks.procs[0].pid
        lo, _ = _segment_range(pid, board=board)
        deadline = time.monotonic() + 30
        with open(f"/proc/{pid}/mem", "r+b", buffering=0) as mem:
            # The peers keep storing their own counters: scribble until one of them notices.
            try:
                while all(p.poll() is None for p in ranks.procs) and time.monotonic() < deadline:
                    for off, value in garbage.items():
                        mem.seek(lo + off)
                        mem.write(value)
            except OSError:
                pass  # unmapped (the rank gave up the segment) or exited
        finished = ranks.finish(timeout=60)
    messages = []
    for r, (code, out, err) in enumerate(finished):
        assert code == 0, f"rank {r} exited {code} (a signal if negative)\n{err}"
        result = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
        assert result["error"] == "PeerError" and result["message"].isprintable(), (r, result)
        messages.append(result["message"])
    return messages


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="writes through /proc/<pid>/mem")
def test_garbage_in_the_shared_segment_is_a_peer_error_not_a_crash() -> None:
    # The segment's header: magic, payload bytes, nonce, pid; then the link's payload: two 448-byte
    # RingStates at 64 and 512 (written at +0, read at +64 of each), then the rings.
    values = {8: 1 << 62, 64: 0xDEADBEEFDEADBEEF, 128: 0xFFFFFFFFFFFFFFF0, 512: 0xDEADBEEFDEADBEEF, 576: 7 << 40}
    garbage = {off: struct.pack("<Q", v) for off, v in values.items()}
    messages = _scribble_until_a_rank_fails(2, SHM_JOB, garbage, board=False)
    assert any("shared memory" in m and "corrupt" in m for m in messages), messages


BOARD_JOB = """
g = dist.init(strict=True, backend="ring", timeout=30)
dist.all_sum(np.ones(4, np.float32), timeout=30)
assert "board:shm" in g._core.link_kinds(), g._core.link_kinds()
print("READY", flush=True)
try:
    while True:
        dist.all_sum(np.ones(1024, np.float32), timeout=30)
except dist.DistributedError as exc:
    report(error=type(exc).__name__, message=str(exc))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="writes through /proc/<pid>/mem")
def test_garbage_on_the_board_is_a_peer_error_not_a_crash() -> None:
    # The board is the payload of its segment, after the segment's 64-byte header: the board's
    # header (posts, then aborted_by and reason_len at +64 and +68, the gates at +320), then
    # 3 ranks x 2 slots of 16448 bytes from +384, each starting with its sequence number.
    area, n = 64, 3
    garbage = {area + 384 + i * 16448: struct.pack("<Q", 0xDEADBEEFDEADBEEF) for i in range(2 * n)}
    garbage[area + 68] = struct.pack("<I", 0xFFFFFFFF)  # reason_len: far past the reason's 240 bytes
    messages = _scribble_until_a_rank_fails(n, BOARD_JOB, garbage, board=True)
    assert any("board" in m and "corrupt" in m for m in messages), messages


# -- no token ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "loopback"),
    [("127.0.0.1:5000", True), ("127.3.2.1:1", True), ("[::1]:5000", True), ("localhost:80", True),
     ("10.0.0.1:5000", False), ("0.0.0.0:5000", False), ("[fe80::1]:5000", False), ("myhost:5000", False)],
)
def test_loopback_addresses_are_told_apart(address: str, loopback: bool) -> None:
    assert is_loopback(split_addr(address).host) is loopback


def test_the_warning_is_due_only_without_a_token_off_loopback() -> None:
    def ring(*rows: str) -> list:
        return [[split_addr(a)] for a in rows]

    assert needs_warning(RankEnv(), ring("127.0.0.1:1", "127.0.0.1:2")) is None
    assert str(needs_warning(RankEnv(), ring("127.0.0.1:1", "10.9.9.9:2"))) == "10.9.9.9:2"
    assert needs_warning(RankEnv(token="secret"), ring("10.9.9.9:1")) is None


WARN_RANK = """
import warnings
from mlx_jupyter.collective.auth_warning import warn_if_unauthenticated
from mlx_jupyter.vocab import rank_env
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    g = dist.init(strict=True, backend="ring", timeout=60)
    dist.all_sum(np.ones(4, np.float32), timeout=60)
    env = rank_env.current()
    again = warn_if_unauthenticated(env, rank_env.load_ring(env).addresses)  # as the next group of this process would
report(warnings=[str(w.message) for w in caught if "MLX_JUPYTER_TOKEN" in str(w.message)], again=again)
"""


def test_no_warning_on_loopback_without_a_token() -> None:
    with Ranks(2, WARN_RANK, env={"MLX_JUPYTER_TOKEN": ""}) as ranks:
        res = ranks.start().results(90)
    assert res == [{"warnings": [], "again": False}] * 2, res


def _netns_skip_reason() -> str | None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "needs root and iproute2 for a network namespace"
    return None


@pytest.mark.timeout(180)
def test_warning_once_without_a_token_on_a_non_loopback_address(tmp_path) -> None:
    require("a network namespace", _netns_skip_reason())
    ns = f"mjw{os.getpid()}"
    addr = f"10.251.{os.getpid() % 250}.1"  # exists only inside the namespace we create
    run = lambda *argv: subprocess.run(argv, capture_output=True, text=True, timeout=20)  # noqa: E731
    if run("ip", "netns", "add", ns).returncode != 0:
        require("a network namespace", "`ip netns add` does not work here")
    try:
        # A non-loopback address on the namespace's own lo: no kernel module (dummy, veth) needed.
        for argv in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", f"{addr}/32", "dev", "lo"]):
            res = run("ip", "netns", "exec", ns, *argv)
            assert res.returncode == 0, res.stderr
        hostfile = tmp_path / "hostfile.json"
        hostfile.write_text(json.dumps([[f"{addr}:7100"], [f"{addr}:7101"]]))
        base = {**os.environ, "MLX_HOSTFILE": str(hostfile)}
        base.pop("MLX_JUPYTER_TOKEN", None)
        procs = [subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", PRELUDE + WARN_RANK],
                                  env={**base, "MLX_RANK": str(r)}, text=True, cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(2)]
        try:
            outs = [p.communicate(timeout=120) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=10)
    finally:
        run("ip", "netns", "delete", ns)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
        result = json.loads([ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1][7:])
        warned = result["warnings"]
        assert result["again"] is False and len(warned) == 1 and addr in warned[0] and "anyone who can reach" in warned[0], warned
