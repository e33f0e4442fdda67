"""A reply streamed token by token in a `%%mlx_distributed` cell shows on IOPub before its newline (issue 43 §1).

Rank 0 prints its tokens with ``end="", flush=True``, then tells the test (a loopback connection) when it
printed the last of them, and prints the newline only once the test, having seen the tokens, answers.
"""

from __future__ import annotations

import queue
import socket
import time

import pytest

from tests.cluster.kernel import CellResult, cluster_kernel

pytestmark = pytest.mark.timeout(180)

#: how long after rank 0 printed them its tokens may reach the notebook's IOPub: the cell's display shows a
#: partial line at its next pass (every 50 ms); the rest is the rank's send and the kernels' threads on a busy box
BOUND = 0.5

CELL = """%%mlx_distributed
import socket, time
print("hello", flush=True)
if world.rank() == 0:
    for token in ("streamed", " tokens"):
        print(token, end="", flush=True)
    printed = time.monotonic()
    with socket.create_connection(("127.0.0.1", {port}), timeout=60) as s:
        s.settimeout(60)
        s.sendall(f"{{printed}}\\n".encode())
        s.recv(1)   # the test saw the tokens
    print(" end")
"""


@pytest.fixture(scope="module")
def kernel():
    yield from cluster_kernel(2, 90, stop=True)


def test_partial_tokens_reach_iopub_before_the_newline(kernel):
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(60)
        msg_id = kernel.submit(CELL.format(port=server.getsockname()[1]))
        res = CellResult()
        seen_at = None
        deadline = time.monotonic() + 60
        while seen_at is None:   # the cell's IOPub messages until the tokens are there
            assert time.monotonic() < deadline, f"no streamed tokens on IOPub within 60 s: {res.stdout!r}"
            try:
                msg = kernel.kc.get_iopub_msg(timeout=deadline - time.monotonic())
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                assert not res.absorb(msg["msg_type"], msg["content"]), f"the cell ended first: {res}"
                if "[rank 0] streamed tokens" in res.stdout:
                    seen_at = time.monotonic()
        conn, _ = server.accept()
        with conn:
            conn.settimeout(60)
            printed = float(conn.makefile().readline())
            assert res.stdout == "[ranks 0-1] hello\n[rank 0] streamed tokens", res.stdout   # no newline yet
            assert seen_at - printed < BOUND, f"the tokens reached IOPub {seen_at - printed:.3f} s after the print"
            conn.sendall(b"x")
        while not kernel.drain(msg_id, res):
            assert time.monotonic() < deadline, f"the cell did not end: {res}"
    assert res.stdout == "[ranks 0-1] hello\n[rank 0] streamed tokens end\n", res.stdout
    assert res.stderr == "", res.stderr
