"""Which CPUs each local rank may run on: its own share of this machine's, as mpirun binds ranks.

Two unbound ranks that spin in collectives can be left on one core by the scheduler while the
other core runs something else; each op then costs a context switch (12-19 µs for a 4 KiB
all_sum, against 2.6 µs on two cores: issue 23). A share is a contiguous block of the CPUs the
launcher may use, the same size for every rank, so a rank's own compute threads (MLX, BLAS) keep
several cores on a large machine. Pure planning here; :func:`for_children` is the one OS call (Linux has
``sched_setaffinity``; macOS has no CPU binding, so there it does nothing).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Optional, Sequence

#: --bind-to values: ``cores`` (a share each, when there are enough CPUs) or ``none``.
POLICIES = ("cores", "none")


def cpu_shares(allowed: Sequence[int], ranks: int) -> Optional[list[frozenset[int]]]:
    """``ranks`` disjoint, equal, contiguous blocks of ``allowed`` (sorted), or None when there are
    fewer CPUs than ranks (binding would only pin ranks onto each other) or at most one rank."""
    cpus = sorted(set(allowed))
    if ranks < 2 or len(cpus) < ranks:
        return None
    per = len(cpus) // ranks
    return [frozenset(cpus[r * per:(r + 1) * per]) for r in range(ranks)]


def allowed_cpus() -> Optional[list[int]]:
    """The CPUs this process may use (its affinity, which a cgroup or taskset may narrow), or None
    where the OS has no CPU binding."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return sorted(os.sched_getaffinity(0))


def check_policy(policy: str, name: str = "--bind-to") -> str:
    """``policy`` if it is one of :data:`POLICIES`; else ValueError naming ``name`` and the choices."""
    if policy not in POLICIES:
        raise ValueError(f"{name} {policy!r}: choose one of {', '.join(POLICIES)}")
    return policy


def plan(policy: str, local_ranks: int) -> Optional[list[frozenset[int]]]:
    """The share of each local rank under ``policy``, or None to leave placement to the OS."""
    if check_policy(policy) == "none":
        return None
    cpus = allowed_cpus()
    return cpu_shares(cpus, local_ranks) if cpus else None


@contextlib.contextmanager
def for_children(share: Optional[frozenset[int]]) -> Iterator[bool]:
    """While inside, this thread runs on ``share``, and so does every process it spawns (a child
    starts with its parent thread's CPUs, before it runs any code); the thread's own are restored
    after. Yields False when nothing was bound (no share, no OS support, or the OS refused)."""
    if not share or not hasattr(os, "sched_setaffinity"):
        yield False
        return
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, share)
    except OSError:   # a CPU taken away since the plan: the rank runs unbound, as before
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setaffinity(0, before)


def describe(share: frozenset[int]) -> str:
    """``cpu 3`` or ``cpus 0-4`` (contiguous, as cpu_shares makes them) for logs."""
    lo, hi = min(share), max(share)
    return f"cpu {lo}" if lo == hi else f"cpus {lo}-{hi}" if hi - lo + 1 == len(share) else \
        "cpus " + ",".join(map(str, sorted(share)))
