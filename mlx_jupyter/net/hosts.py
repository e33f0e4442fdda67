"""Which host names mean this machine."""

from __future__ import annotations

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def is_local(host: str) -> bool:
    """Whether ``host`` (``user@host`` allowed) names this machine."""
    return host.split("@")[-1] in LOCAL_HOSTS
