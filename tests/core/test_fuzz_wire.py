"""Fuzzing the wire parsers of a real rank over raw sockets: handshake, link setup, message headers.

Every input must end in a refusal or an error within a bounded time, the rank must stay
alive, and a real job must complete afterwards.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import queue
import socket
import struct
import subprocess
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ranks import Ranks

TOKEN = b"test-token"
MAGIC = b"MLXJHS01"
LINK_MAGIC = 0x4D4A4C4B
HOST_ID = "fuzz-host"  # the rank's MLX_JUPYTER_HOST_ID: lets the impostor claim to share its host
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))


def _mac(role: bytes, ni: bytes, na: bytes, header: bytes = b"") -> bytes:
    return hmac.new(TOKEN, role + ni + na + header, hashlib.sha256).digest()


def _recv_exact(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def _connect(port: int, timeout: float = 10) -> socket.socket:
    """Dials, retrying while the rank is not listening yet (a bounded readiness probe)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
            s.settimeout(timeout)
            return s
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, f"nothing listens on port {port}"
            time.sleep(0.01)


def _ends(s: socket.socket, timeout: float = 8) -> None:
    """The rank ends what we sent (refusal or error): our read sees end-of-file, not silence."""
    s.settimeout(timeout)
    try:
        while s.recv(4096):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass


class Lines:
    """A rank's stdout read by a thread, so that every wait for a line is bounded."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.q: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.q.put(ln) for ln in proc.stdout], daemon=True).start()

    def next(self, prefix: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.q.get(timeout=max(0.01, deadline - time.monotonic()))
            if line.startswith(prefix):
                return line[len(prefix):].strip()


# -- 1. strangers and token holders at a formed job's acceptors ---------------------------------------

JOB = """
g = dist.init(strict=True, backend="ring", timeout=60)
print("READY", flush=True)
sys.stdin.readline()
report(sum=dist.all_sum(np.arange(8, dtype=np.int64) * (RANK + 1), timeout=60).tolist())
"""

# Group 1 is the world: a token holder re-forming it would (rightly) abort the job, so fuzz other ids.
header = st.tuples(st.integers(2, 2**64 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
                   st.integers(0, 2**32 - 1), st.sampled_from([0, 1, 2, 3, 2**32 - 1]))
handshake_input = st.one_of(
    st.binary(max_size=200).map(lambda b: ("raw", b)),
    st.binary(max_size=39).map(lambda b: ("greeting", MAGIC + b)),  # truncated hello
    st.integers(1, 1 << 20).map(lambda n: ("oversized", MAGIC + os.urandom(32) + b"\xff" * n)),
    st.tuples(header, st.booleans(), st.binary(max_size=80)).map(lambda t: ("answer", t)),
)


@pytest.mark.timeout(120)
def test_fuzzed_handshakes_are_refused_and_the_job_goes_on() -> None:
    with Ranks(2, JOB, token=TOKEN.decode()) as ranks:
        ranks.start()
        lines = [Lines(p) for p in ranks.procs]
        for ln in lines:
            ln.next("READY")
        ports = [p + 1000 for p in ranks.ports]
        t0 = time.monotonic()

        @FUZZ
        @given(target=st.integers(0, 1), case=handshake_input)
        def one(target: int, case: tuple) -> None:
            kind, data = case
            with _connect(ports[target]) as s:
                if kind != "answer":
                    try:
                        s.sendall(data)
                        s.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass  # refused before we finished: also an end
                    _ends(s)
                    return
                # A token holder: a valid proof, then a header that is garbled or names no group.
                (group, initiator, kind_, index, world), good_mac, tail = data
                ni = os.urandom(32)
                s.sendall(MAGIC + ni)
                reply = _recv_exact(s, 72)
                assert reply[:8] == MAGIC and reply[40:] == _mac(b"A", ni, reply[8:40])
                h = struct.pack("<QIIII", group, initiator, kind_, index, world)
                s.sendall(h + (_mac(b"I", ni, reply[8:40], h) if good_mac else os.urandom(32)) + tail)
                ok = s.recv(1)
                assert ok in (b"", b"\x00", b"\x01"), ok
                if ok != b"\x01":
                    _ends(s)

        one()
        assert time.monotonic() - t0 < 90
        assert all(p.poll() is None for p in ranks.procs), "a rank died under fuzzing"
        for p in ranks.procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        res = [json.loads(ln.next("RESULT ", timeout=60)) for ln in lines]
        assert [p.wait(timeout=30) for p in ranks.procs] == [0, 0]
    assert res[0]["sum"] == res[1]["sum"] == [3 * i for i in range(8)], res


# -- 2. an impostor rank 1 (holding the token) fuzzing link setup and message headers -----------------

SERVER = """
print("READY", flush=True)
for line in sys.stdin:
    if line.strip() == "exit":
        break
    g = None
    try:
        g = dist.init(strict=True, backend="ring", timeout=float(line))
        out = dist.all_sum(np.arange(4, dtype=np.float32), timeout=float(line)).tolist()
        print("DONE ok " + json.dumps(out), flush=True)
    except Exception as exc:
        print("DONE " + type(exc).__name__ + " " + str(exc).replace(chr(10), " "), flush=True)
    if g is not None and not g.aborted:
        g.abort("next example")
report(alive=True, sum=dist.all_sum(np.arange(4, dtype=np.float32) * (RANK + 1), timeout=60).tolist()
       if dist.init(strict=True, backend="ring", timeout=60) else None)
"""

STAGES = ("reply to its offer", "ack of its segment", "our offer", "our segment info", "message header")
locator = st.one_of(
    st.binary(max_size=96),
    st.builds(lambda fd, nonce: f"/proc/{os.getpid()}/fd/{fd}#{nonce:016x}".encode(),
              st.integers(0, 64), st.integers(0, 2**64 - 1)),
    st.builds(lambda slot, tail: f"/mlxj.{os.geteuid()}.{slot}{tail}".encode(),
              st.integers(-1, 99), st.sampled_from(["", "#", "#zz", "#0123456789abcdef"])),
)
link_input = st.one_of(
    st.tuples(st.just("reply to its offer"), st.binary(max_size=16)),
    st.tuples(st.just("reply to its offer"), st.tuples(st.sampled_from([LINK_MAGIC, 0, 1]), st.integers(0, 2**32 - 1))),
    st.tuples(st.just("ack of its segment"), st.binary(max_size=16)),
    st.tuples(st.just("our offer"), st.binary(max_size=64)),
    st.tuples(st.just("our segment info"),
              st.tuples(st.sampled_from([LINK_MAGIC, 7]), st.integers(0, 2**32 - 1), locator,
                        st.sampled_from([4 << 20, 0, 1, 2**64 - 1]))),
    st.tuples(st.just("message header"), st.binary(max_size=64)),
    st.tuples(st.just("message header"),
              st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 2**32 - 1),
                        st.integers(0, 2**64 - 1), st.binary(max_size=64))),
)


class Impostor:
    """Plays rank 1 of a two-rank job against a real rank 0: the handshakes, then a fuzzed step."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = ports
        self.listener = socket.create_server(("127.0.0.1", ports[1]))
        self.listener.settimeout(10)

    def accept_dial(self) -> socket.socket:
        """Rank 0 dials rank 1: our side of the handshake, as the acceptor."""
        s, _ = self.listener.accept()
        s.settimeout(10)
        hello = _recv_exact(s, 40)
        na = os.urandom(32)
        s.sendall(MAGIC + na + _mac(b"A", hello[8:], na))
        _recv_exact(s, 56)
        s.sendall(b"\x01")
        return s

    def dial(self) -> socket.socket:
        """We dial rank 0 as rank 1 of the ring: our side of the handshake, as the dialer."""
        s = _connect(self.ports[0])
        ni = os.urandom(32)
        s.sendall(MAGIC + ni)
        reply = _recv_exact(s, 72)
        h = struct.pack("<QIIII", 1, 1, 1, 0, 2)
        s.sendall(h + _mac(b"I", ni, reply[8:40], h))
        assert _recv_exact(s, 1) == b"\x01"
        return s

    def play(self, stage: str, data: object) -> None:
        right = self.accept_dial()  # rank 0's link to us: it offers, we answer
        left = self.dial()  # our link to rank 0: we offer, it answers
        with right, left:
            _recv_exact(right, 40)  # its offer
            if stage == "reply to its offer":
                right.sendall(data if isinstance(data, bytes) else struct.pack("<II", *data))
                return
            if stage == "ack of its segment":
                right.sendall(struct.pack("<II", LINK_MAGIC, 1))
                _recv_exact(right, 112)  # its segment info
                right.sendall(data)
                return
            right.sendall(struct.pack("<II", LINK_MAGIC, 0))  # TCP, please
            if stage == "our offer":
                left.sendall(data)
                return
            if stage == "our segment info":
                magic, length, loc, ring = data
                left.sendall(struct.pack("<II32s", LINK_MAGIC, 1, hashlib.sha256(HOST_ID.encode()).digest()))
                if struct.unpack("<II", _recv_exact(left, 8))[1] == 1:
                    left.sendall(struct.pack("<II96sQ", magic, length, loc, ring))
                return
            left.sendall(struct.pack("<II32s", LINK_MAGIC, 0, bytes(32)))
            _recv_exact(left, 8)
            if isinstance(data, bytes):
                left.sendall(data)
            else:
                op, dtype, seq, nbytes, payload = data
                left.sendall(struct.pack("<HBBIQ", 0x4D4A, op, dtype, seq, nbytes) + payload)


@pytest.mark.timeout(180)
def test_fuzzed_link_setup_and_headers_end_in_errors_and_the_rank_lives() -> None:
    with Ranks(2, SERVER, token=TOKEN.decode(), env={"MLX_JUPYTER_HOST_ID": HOST_ID}) as ranks:
        ranks.start(only=[0])
        lines = Lines(ranks.procs[0])
        lines.next("READY")
        impostor = Impostor([p + 1000 for p in ranks.ports])
        rank0 = ranks.procs[0]
        outcomes: list[str] = []
        t0 = time.monotonic()

        @FUZZ
        @given(case=link_input)
        def one(case: tuple) -> None:
            rank0.stdin.write("5\n")
            rank0.stdin.flush()
            try:
                impostor.play(*case)
            except OSError:
                pass  # the rank hung up first: also an end
            done = lines.next("DONE ", timeout=20)  # the rank answers every input, and in bounded time
            outcomes.append(done)
            assert done.startswith(("ok", "PeerError", "MismatchError", "SetupError", "AbortedError")), done

        try:
            one()
        finally:
            impostor.listener.close()
        assert time.monotonic() - t0 < 120
        assert rank0.poll() is None, "rank 0 died under fuzzing"
        # The job still works: the real rank 1 joins.
        rank0.stdin.write("exit\n")
        rank0.stdin.flush()
        ranks.start(only=[1])
        ranks.procs[1].stdin.write("exit\n")  # straight to the real job
        ranks.procs[1].stdin.flush()
        r0 = json.loads(lines.next("RESULT ", timeout=60))
        code0 = rank0.wait(timeout=30)
        out1, err1 = ranks.procs[1].communicate(timeout=60)
    assert code0 == 0 and ranks.procs[1].returncode == 0, err1
    r1 = json.loads([ln for ln in out1.splitlines() if ln.startswith("RESULT ")][-1][7:])
    assert r0["sum"] == r1["sum"] == [0.0, 3.0, 6.0, 9.0], (r0, r1, err1)
    assert any(o.startswith(("PeerError", "MismatchError", "SetupError")) for o in outcomes), outcomes
