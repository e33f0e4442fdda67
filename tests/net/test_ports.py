"""Local port blocks stay clear of the OS's ephemeral range, and are free when returned."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlx_jupyter.vocab import ports


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


def test_block_starts_reach_the_edges_exactly():
    # below: the last start's shifted block ends at lo - 1; above: the first start is hi + 1 and the
    # last start's shifted block ends at port 65535 (the highest there is)
    assert ports.block_starts(4, 1000, (49152, 65535)) == [range(ports.LOWEST, 49152 - 1000 - 4 + 1)]
    assert ports.block_starts(1, 0, (1024, 20000)) == [range(20001, 65536)]
    assert ports.block_starts(3, 7, (1024, 20000)) == [range(20001, 65536 - 7 - 3 + 1)]
    # a range of one start is kept; none at all when the blocks cannot fit on either side
    one = ports.LOWEST + 1000 + 4
    assert ports.block_starts(4, 1000, (one, 65535)) == [range(ports.LOWEST, ports.LOWEST + 1)]
    assert ports.block_starts(4, 1000, (one - 1, 65535)) == []
    assert ports.block_starts(2, 0, (1024, 65533)) == [range(65534, 65535)]
    assert ports.block_starts(2, 0, (1024, 65534)) == []


def test_linux_range_is_the_one_in_proc():
    with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
        want = tuple(int(v) for v in fh.read().split())
    assert ports.ephemeral_range() == want


def test_without_room_outside_the_ephemeral_range_blocks_come_from_all_ports_up_to_65535(monkeypatch):
    # offset 65530 - LOWEST: no start clears this machine's ephemeral range, and the only starts that
    # keep both blocks under 65536 are LOWEST..LOWEST+5 (the last one's shifted port is 65535). The ports'
    # binds are simulated (ports.socket): which of these ten ports some other process holds on this machine
    # at that moment is not this test's (a real one once failed CI that way)
    monkeypatch.setattr(ports, "_reserved", [])
    offset = 65535 - ports.LOWEST - 5
    assert ports.block_starts(1, offset, ports.ephemeral_range()) == []
    starts = {*range(ports.LOWEST, ports.LOWEST + 6)}
    taken = {ports.LOWEST + offset}   # a port already bound: the block that needs it is never returned
    bound: list[int] = []

    class Socket:
        def __init__(self, *args: object) -> None:
            pass

        def bind(self, address: tuple[str, int]) -> None:
            if address[1] in taken:
                raise OSError(98, "Address already in use")
            bound.append(address[1])

        def close(self) -> None:
            pass

    monkeypatch.setattr(ports, "socket", SimpleNamespace(socket=Socket, AF_INET=socket.AF_INET,
                                                         SOCK_STREAM=socket.SOCK_STREAM))
    got = {ports.free_port_block(1, offset=offset, tries=400) for _ in range(5)}
    assert got == starts - {ports.LOWEST}, got
    assert set(bound) <= {*starts, *(p + offset for p in starts)} and max(bound) == 65535
    with pytest.raises(ports.PortError, match=rf"no block of 1 free ports \(and \+{offset}\) found on 127.0.0.1"):
        ports.free_port_block(1, offset=offset, tries=50)


def test_a_start_is_drawn_evenly_over_all_starts_not_per_range(monkeypatch):
    # two ranges of very different sizes: a start from the small one as often as its share of
    # all starts (weighted), not half of the time (one range, then a start in it)
    n, offset = 4, 1000
    ranges = ports.block_starts(n, offset, ports.ephemeral_range())
    if len(ranges) != 2:
        pytest.skip(f"this machine's ephemeral range leaves {len(ranges)} range(s) of starts")
    small = min(ranges, key=len)
    share = len(small) / sum(map(len, ranges))
    assert share < 0.3, ranges
    monkeypatch.setattr(ports, "_reserved", [])
    draws = 200
    hits = sum(ports.free_port_block(n, offset) in small for _ in range(draws))
    assert hits < draws * (share + 0.5) / 2, (hits, share)   # weighted: ~share; per range: ~half


@pytest.mark.parametrize("block, offset", [
    (range(31767, 31768), 1000),    # +1000 ends at 32767, below Linux's outgoing ports
    (range(31768, 31769), -1000),   # +1000 would be Linux's first outgoing port
    (range(32323, 32327), -1000),   # MLX's default starting port: our core on 31323..
    (range(31760, 31770), -1000),   # one port of the block reaching in turns the whole block
    (range(33767, 33768), -1000),   # -1000 is 32767
    (range(33768, 33769), 1000),    # -1000 is in Linux's range too: +1000, as without the rule
    (range(48100, 48104), 1000),    # a macOS block below its range: both shifts land in Linux's
    (range(61000, 61004), 1000),    # a Linux block above its range: +1000 in macOS's, -1000 in Linux's
    (range(20000, 20008), 1000),    # Slurm's derived band
])
def test_core_offset_turns_down_only_where_up_lands_among_outgoing_ports(block, offset):
    assert ports.core_offset(block) == offset


def _clear(block: range, offset: int) -> bool:
    return all(p + offset < 32768 or p + offset > 65535 for p in block)   # both OSes' outgoing ports, at once


@given(start=st.integers(1, 65535), n=st.integers(1, 64))
def test_core_offset_is_minus_1000_exactly_when_only_that_is_clear(start, n):
    block = range(start, min(start + n, 65536))
    want = -1000 if not _clear(block, 1000) and _clear(block, -1000) else 1000
    assert ports.core_offset(block) == want


def test_free_blocks_are_ones_the_ranks_shift_up():
    for n in (1, 4, 16):
        start = ports.free_port_block(n)
        assert ports.core_offset(range(start, start + n)) == 1000


def test_on_macos_a_block_the_ranks_would_shift_down_is_not_handed_out(monkeypatch):
    """macOS's outgoing ports start at 49152, so local blocks may lie in 31768..33767, where the ranks shift
    our core's ports down (core_offset) from where this checked them free: such a draw is skipped."""
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (49152, 65535))
    draws = iter([31767, 32323, 33764, *range(20000, 30000, 8)])   # 31767..31770: +1000 reaches 32768
    monkeypatch.setattr(ports.random, "choice", lambda seq: next(draws))
    start = ports.free_port_block(4)
    assert start >= 20000 and ports.core_offset(range(start, start + 4)) == 1000
