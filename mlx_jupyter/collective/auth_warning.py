"""The once-per-process warning for a ring formed without a token on a reachable address."""

from __future__ import annotations

import ipaddress
import warnings
from typing import Sequence

from mlx_jupyter.vocab.rank_env import TOKEN, RankEnv
from mlx_jupyter.vocab.hosts import Address


class UnauthenticatedRingWarning(UserWarning):
    """A ring was formed without a token on an address other hosts may reach."""


_warned = False


def is_loopback(host: str) -> bool:
    """True for a 127.x.y.z, ::1 or "localhost" host (an Address's host); False for anything else."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name may resolve anywhere


def needs_warning(env: RankEnv, addresses: Sequence[Sequence[Address]]) -> Address | None:
    """The first non-loopback address of a ring formed without a token, or None when no warning is due."""
    if env.token:
        return None
    return next((a for rank in addresses for a in rank if not is_loopback(a.host)), None)


def warn_if_unauthenticated(env: RankEnv, addresses: Sequence[Sequence[Address]]) -> bool:
    """Warns (once per process) that the ring accepts anyone; returns True if it warned now."""
    global _warned
    exposed = needs_warning(env, addresses)
    if exposed is None or _warned:
        return False
    _warned = True
    warnings.warn(
        f"{TOKEN} is not set, so this ring does not authenticate its peers: anyone who can reach "
        f"{exposed} can join it. Set the same secret on every rank (export {TOKEN}=$(openssl rand -hex 16)); "
        "`mlx-jupyter launch` sets one for you.",
        UnauthenticatedRingWarning,
        stacklevel=4,
    )
    return True
