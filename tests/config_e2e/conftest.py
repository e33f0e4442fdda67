"""Fixtures for the configurator's end-to-end tests on the namespace test bed (tests/conftest.py)."""

from __future__ import annotations

import pytest

from e2e_helpers import FIXTURES
from fake_macs import FakeCluster


@pytest.fixture
def fake_cluster(testbed):
    """Factory: serve a recorded case from the bed's hosts; every cluster is removed after the test."""
    made: list[FakeCluster] = []

    def make(case: str, **kw) -> FakeCluster:
        made.append(FakeCluster(testbed, FIXTURES / case, **kw))
        return made[-1]

    yield make
    for cluster in made:
        cluster.remove()
    for i in range(1, testbed.n + 1):
        assert not any(testbed.host_bin(i).iterdir()), f"h{i}'s bin not emptied"
