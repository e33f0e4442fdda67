"""Fixtures for the launcher's integration tests (the 4-host `testbed` itself is in tests/conftest.py)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

# the session-wide `testbed` fixture lives in tests/conftest.py


@pytest.fixture
def healthy(testbed):
    """The test bed, with every cable plugged back in after the test."""
    yield testbed
    for i in range(1, testbed.n + 1):
        testbed.heal(i)


def free_port_block(count: int, offset: int = 1000, host: str = "127.0.0.1") -> int:
    """A base port P with P..P+count-1 and the same +offset free on ``host`` (bind-probed)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind((host, 0))
            base = s.getsockname()[1]
        if base + count + offset > 65535:
            continue
        socks = []
        try:
            for port in [*range(base, base + count), *range(base + offset, base + offset + count)]:
                t = socket.socket()
                socks.append(t)
                t.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise RuntimeError("no free port block")


@pytest.fixture
def port_block():
    """Factory: a free port block for a local ring of ``n`` ranks."""
    return free_port_block


@pytest.fixture
def env_pythonpath():
    """Env so that ranks can import mlx_jupyter from this checkout."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
