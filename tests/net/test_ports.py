"""Local port blocks stay clear of the OS's ephemeral range, and are free when returned."""

from __future__ import annotations

import socket

from hypothesis import given
from hypothesis import strategies as st

from mlx_jupyter.net import ports


@given(n=st.integers(1, 64), offset=st.integers(0, 5000),
       lo=st.integers(1024, 65000), width=st.integers(0, 40000))
def test_block_starts_never_touch_the_ephemeral_range(n, offset, lo, width):
    hi = min(65535, lo + width)
    for r in ports.block_starts(n, offset, (lo, hi)):
        for start in (r.start, r.stop - 1):
            for block in (range(start, start + n), range(start + offset, start + offset + n)):
                assert block.stop - 1 < lo or block.start > hi
                assert block.start >= ports.LOWEST and block.stop - 1 <= 65535


def test_free_block_is_outside_this_machines_ephemeral_range_and_free():
    lo, hi = ports.ephemeral_range()
    start = ports.free_port_block(4)
    for port in [*range(start, start + 4), *range(start + 1000, start + 1004)]:
        assert not lo <= port <= hi
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_linux_range_is_read_from_proc():
    lo, hi = ports.ephemeral_range()
    assert 1024 <= lo <= hi <= 65535


def test_blocks_handed_out_one_after_another_never_overlap():
    # Nothing binds them in between, as when several jobs are started before any rank is up:
    # the bind check alone would see every earlier block free again.
    seen: set[int] = set()
    for n in [4, 2, 3, 4, 1, 8] * 20:
        start = ports.free_port_block(n)
        block = {*range(start, start + n), *range(start + 1000, start + 1000 + n)}
        assert not block & seen, (start, n)
        seen |= block
