"""Fixtures for the launcher's integration tests (the 4-host `testbed` itself is in tests/conftest.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mlx_jupyter.vocab.ports import free_port_block

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


@pytest.fixture
def port_block():
    """Factory: a free port block for a local ring of ``n`` ranks."""
    return free_port_block


@pytest.fixture
def env_pythonpath():
    """Env so that ranks can import mlx_jupyter from this checkout."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
