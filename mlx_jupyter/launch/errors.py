"""Errors the launcher raises; messages name the rank, host and fix."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """The launch could not be started or carried out."""
