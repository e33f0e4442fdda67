"""The once-per-process warning for a ring formed without MLX_JUPYTER_TOKEN on a reachable address."""

from __future__ import annotations

import ipaddress
import warnings


class UnauthenticatedRingWarning(UserWarning):
    """A ring was formed without a token on an address other hosts may reach."""


_warned = False


def _host(address: str) -> str:
    host = address.rsplit(":", 1)[0] if address.count(":") == 1 or address.startswith("[") else address
    return host.strip("[]")


def is_loopback(address: str) -> bool:
    """True for "127.x.y.z:port", "[::1]:port" and "localhost:port"; False for anything else."""
    host = _host(address)
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name may resolve anywhere


def needs_warning(token: str, addresses: list[list[str]]) -> str | None:
    """The first non-loopback address of a tokenless ring, or None when no warning is due."""
    if token:
        return None
    return next((a for rank in addresses for a in rank if not is_loopback(a)), None)


def warn_if_unauthenticated(token: str, addresses: list[list[str]]) -> bool:
    """Warns (once per process) that the ring accepts anyone; returns True if it warned now."""
    global _warned
    exposed = needs_warning(token, addresses)
    if exposed is None or _warned:
        return False
    _warned = True
    warnings.warn(
        f"MLX_JUPYTER_TOKEN is not set, so this ring does not authenticate its peers: anyone who can reach "
        f"{exposed} can join it. Set the same secret on every rank (export MLX_JUPYTER_TOKEN=$(openssl rand -hex 16)); "
        "`mlx-jupyter launch` sets one for you.",
        UnauthenticatedRingWarning,
        stacklevel=4,
    )
    return True
