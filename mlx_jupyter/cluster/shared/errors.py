"""The cluster's one error type."""

from __future__ import annotations


class ClusterError(RuntimeError):
    """The cluster could not do what was asked; the message says which rank and why."""
