"""What a test needs from the machine: skip without it locally, fail without it under CI (CI=true).

CI (`.ci/run`) installs and builds everything the suite uses, so a missing native core, namespace
test bed, Slurm bed or torch there is a broken build, not a reason to skip.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Optional

import pytest


def under_ci() -> bool:
    """Whether the tests run under CI (`CI=true`, which `.ci/run` sets)."""
    return os.environ.get("CI") == "true"


def require(what: str, why: Optional[str]) -> None:
    """Nothing when ``why`` is None; else skip (locally) or fail (under CI) saying ``what`` is missing and why."""
    if why is None:
        return
    if under_ci():
        pytest.fail(f"{what} is missing under CI (CI=true): {why}", pytrace=False)
    pytest.skip(f"{what}: {why}", allow_module_level=True)


def require_module(name: str, what: str) -> ModuleType:
    """``import name``; when it fails, :func:`require` with the ImportError as the reason."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        require(what, f"cannot import {name}: {e}")
        raise  # not reached: require skipped or failed


def require_core() -> ModuleType:
    """The native core (`mlx_jupyter._core`), which `pip install -e .` builds."""
    return require_module("mlx_jupyter._core", "the native core (pip install -e . builds it)")
