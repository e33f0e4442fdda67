"""Fixtures shared by every test directory: the namespace test bed (4 ssh hosts), this process's descendants."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT / "tests", ROOT):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from needs import require  # noqa: E402
from testbed import TestBed, missing_requirements  # noqa: E402

# A shell without job control starts background commands with SIGINT ignored, and Python then
# installs no KeyboardInterrupt handler: the tests of the stop button (SIGINT to this process)
# would see nothing. Give this process the handler an interactive session has.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def testbed(tmp_path_factory):
    """Four ssh hosts h1..h4 (network namespaces with their own IP and sshd), shared by the session."""
    require("the namespace test bed (root, ip netns, sshd)", missing_requirements())
    bed = TestBed(tmp_path_factory.mktemp("testbed"), n=4).up()
    try:
        yield bed
    finally:
        bed.down()
        left = bed.leftovers()
        assert not left, f"test bed left behind: {left}"


def _descendants() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(scope="session")
def descendants() -> Callable[[], set[int]]:
    """The pids of this process's descendants now (controllers, engines, ranks): compare a set
    taken before a test with one taken after to find what it left behind."""
    return _descendants
