"""Sizes in words, the same on both sides of the cluster (the magic, the panel, a rank's messages)."""

from __future__ import annotations

from typing import Optional


def format_bytes(n: Optional[int]) -> str:
    """Bytes as every view shows them (the magic, the status widget, the lab panel, restarts): ``50.0 MiB``, ``?``."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return "?"
