"""The shared-memory locator a peer sends during link setup: only our own segments,
with the announced nonce, are ever mapped; anything else is refused with a clear error."""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import tempfile

import pytest
from hypothesis import given, settings, strategies as st

from mlx_jupyter import _core

MAGIC = 0x4D4C584A53484D31
HEADER = 64  # the segment's: magic, payload bytes, nonce, creator pid (64-byte aligned)
RING_STATE = 448  # one ring state (native/include/mlxj/shm_ring_link.h asserts its size)
LAYOUT = HEADER + 2 * RING_STATE  # then the link's two ring states, then its two rings
RING = 4096
PAYLOAD = LAYOUT - HEADER + 2 * RING  # what a link with rings of RING bytes asks for
NONCE = 0x0123456789ABCDEF
TAIL = f"#{NONCE:016x}"
REFUSED = (_core.MismatchError, _core.SetupError)


def _segment(magic: int = MAGIC, nonce: int = NONCE, size: int = LAYOUT + 2 * RING) -> bytes:
    head = struct.pack("<QQQq", magic, PAYLOAD, nonce, os.getpid())
    return (head + bytes(size))[:size]


@given(st.text(max_size=120))
@settings(max_examples=300, deadline=None)
def test_garbage_locators_are_refused(text: str) -> None:
    with pytest.raises(REFUSED):
        _core._open_segment(text, RING)


# ("/mlxj.<uid>.1000...": slots have at most 3 digits, so no live name is ever touched)
@given(st.sampled_from(["/proc/", f"/mlxj.{os.geteuid()}.1000", "/dev/shm/", "/mlxj.", "/etc/passwd"]),
       st.text(alphabet="0123456789abcdef/#.fdx", max_size=40))
@settings(max_examples=300, deadline=None)
def test_near_miss_locators_are_refused(prefix: str, rest: str) -> None:
    with pytest.raises(REFUSED):
        _core._open_segment(prefix + rest, RING)


@pytest.mark.parametrize("locator, error", [
    ("/proc/self/fd/0" + TAIL, "not a peer's memfd"),
    (f"/mlxj.{os.geteuid()}.1/../../etc/passwd" + TAIL, "not a peer's memfd"),
    (f"/mlxj.{os.geteuid() + 1}.1" + TAIL, "not a peer's memfd"),  # another user's name
    (f"/proc/{os.getpid()}/fd/0", "no segment nonce"),
    (f"/proc/{os.getpid()}/fd/0#xyz", "no segment nonce"),
])
def test_foreign_shapes_are_refused(locator: str, error: str) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("Linux locators")
    with pytest.raises(REFUSED, match=error):
        _core._open_segment(locator, RING)


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="Linux memfd")
def test_memfd_segments_need_a_memfd_the_size_the_magic_and_the_nonce() -> None:
    with tempfile.TemporaryFile() as plain:
        plain.write(_segment())
        plain.flush()
        with pytest.raises(_core.MismatchError, match="not a memfd"):  # an ordinary file is never mapped
            _core._open_segment(f"/proc/{os.getpid()}/fd/{plain.fileno()}{TAIL}", RING)
    cases = [(_segment(), None, True), (_segment(magic=7), "not the mlx_jupyter segment", True),
             (_segment(nonce=NONCE + 1), "not the mlx_jupyter segment", True),
             (_segment(size=LAYOUT), "unexpected size", True),
             (_segment(), "not sealed against resizing", False)]  # a shrink would be SIGBUS in the mapping
    for data, error, sealed in cases:
        fd = os.memfd_create("test", os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, data)
            if sealed:
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
            locator = f"/proc/{os.getpid()}/fd/{fd}{TAIL}"
            if error is None:
                assert _core._open_segment(locator, RING) is True
            else:
                with pytest.raises(_core.MismatchError, match=error):
                    _core._open_segment(locator, RING)
        finally:
            os.close(fd)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm for named objects")
def test_named_segments_are_unlinked_when_opened_and_checked() -> None:
    name = f"mlxj.{os.geteuid()}.59"
    path = f"/dev/shm/{name}"
    # macOS rounds a shm object's size up to whole pages: larger than ours is fine, smaller is not
    pages = -(-(LAYOUT + 2 * RING) // 16384) * 16384
    cases = [(_segment(), None), (_segment(size=pages), None), (_segment(magic=7), "not the mlx_jupyter segment"),
             (_segment(nonce=1), "not the mlx_jupyter segment"), (_segment(size=100), "unexpected size")]
    try:
        for data, error in cases:
            with open(path, "wb") as fh:
                fh.write(data)
            os.chmod(path, 0o600)
            if error is None:
                assert _core._open_segment("/" + name + TAIL, RING) is True
            else:
                with pytest.raises(_core.MismatchError, match=error):
                    _core._open_segment("/" + name + TAIL, RING)
            assert not os.path.exists(path)  # the opener removes the name at once, whatever follows
        with pytest.raises(_core.SetupError, match="cannot open the peer's shared memory"):
            _core._open_segment("/" + name + TAIL, RING)  # gone
    finally:
        if os.path.exists(path):
            os.unlink(path)
