"""Errors that name their cause and leave the group alone (issue 21, items 8 and 10): a bad peer
is a ValueError before anything is sent, a mismatched recv is called a recv, a read-only array
for Buffer.wrap is named as such, and IPv6 peers are printed in brackets."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from needs import require_core
from mlx_jupyter.vocab.ports import free_port_block
from ranks import run

_core = require_core()

BAD_PEER = r"""
g = dist.init(strict=True, backend="ring", timeout=30)
x = np.ones(4, np.float32)
errors = []
for call in (lambda: g._core.send(x, 5, 10.0), lambda: g._core.recv(np.zeros(4, np.float32), RANK, 10.0),
             lambda: g._core.send(x, -1, 10.0), lambda: dist.send(x, 5), lambda: dist.recv(4, "float32", 2)):
    try:
        call()
        errors.append("no error")
    except ValueError as exc:
        errors.append(str(exc))
aborted = g.aborted
total = dist.all_sum(x, timeout=30).tolist()   # the group was not touched: it still works on every rank
report(errors=errors, aborted=aborted, total=total)
"""


def test_a_bad_peer_is_a_value_error_and_the_group_goes_on():
    for r, res in enumerate(run(2, BAD_PEER, timeout=60)):
        native, native_self, native_negative, api_send, api_recv = res["errors"]
        assert native == f"send to rank 5: ranks of this group are 0..1 other than {r} (this rank)", res
        assert native_self == f"recv from rank {r}: ranks of this group are 0..1 other than {r} (this rank)", res
        assert native_negative.startswith("send to rank -1: "), res
        assert api_send == "dst=5 is not a rank of this group of 2 (0..1)", res
        assert api_recv == "src=2 is not a rank of this group of 2 (0..1)", res
        assert not res["aborted"] and res["total"] == [2.0] * 4, res


MISMATCH = r"""
g = dist.init(strict=True, backend="ring", timeout=30)
try:
    if RANK == 0:
        dist.recv(4, "float32", 1, timeout=10)
    else:
        dist.all_sum(np.ones(4, np.float32), timeout=10)
    report(error=None)
except dist.DistributedError as exc:
    report(error=type(exc).__name__, message=str(exc))
"""


def test_a_mismatched_recv_is_called_a_recv():
    r0, _ = run(2, MISMATCH, timeout=60)
    assert r0["error"] == "MismatchError", r0
    assert "rank 1 (127.0.0.1:" in r0["message"] and " sent all_sum of 16 bytes (float32)" in r0["message"], r0
    assert "but this rank called recv of 16 bytes (float32)" in r0["message"], r0


def test_buffer_wrap_of_a_read_only_array_says_so():
    a = np.zeros(3, np.float32)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _core.Buffer.wrap(a)
    with pytest.raises(TypeError, match="cannot view a 'object' object: pass CPU memory"):
        _core.Buffer.wrap(object())
    assert _core.Buffer.wrap(np.zeros(3, np.float32)).shape == [3]


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_ipv6_peers_are_printed_in_brackets():
    """A rank listening on [::1] names a stranger from [::1] in its log, and the peer it waits for, with brackets."""
    p0 = free_port_block(2)
    p1 = p0 + 1
    code = ("import sys\nfrom mlx_jupyter import _core\n"
            "try:\n"
            f"    _core.Group.world(0, [[('::1', {p0})], [('::1', {p1})]],\n"
            f"                      _core.CoreOptions(token='tok-{secrets.token_hex(4)}'), 4.0)\n"
            "except _core.DistributedError as exc:\n"
            "    print('ERROR', exc, flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while True:   # readiness probe: its listener is up
            try:
                with socket.create_connection(("::1", p0), timeout=1) as s:
                    s.sendall(b"not a peer at all, just noise\n" * 4)
                break
            except OSError:
                assert time.monotonic() < deadline, "the rank never listened on [::1]"
                time.sleep(0.05)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert "refused a connection from [::1]:" in err, err
    assert f"rank 1 ([::1]:{p1})" in out, out
    assert "::1:" not in out.replace("[::1]:", ""), out
