"""The where tests' MLX world (one process: MLX's single-rank group) and a fresh record per test."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def world():
    mx = pytest.importorskip("mlx.core")
    from mlx_jupyter.where import mlx_calls

    mlx_calls.install()
    return mx.distributed.init()


@pytest.fixture
def record(world):
    """The record, recording, counting from a new cell; a profile's timing switched off after the test."""
    from mlx_jupyter.where import mlx_calls, mlx_profile

    mlx_calls.enable(True)
    mlx_calls.new_cell()
    yield mlx_calls.RECORD
    mlx_profile.stop()
    mlx_calls.enable(True)
    mlx_calls.new_cell()
