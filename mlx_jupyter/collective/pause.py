"""Tells the native core that this process is paused at a debugger's prompt (its ops do not run).

A peer whose collective waits for this rank asks the core at its deadline (docs/collective-core.md):
while the pause lasts, and for the peer's whole timeout after it ends, the peer does not time out.
"""

from __future__ import annotations

from collections.abc import Callable


def set_paused(paused: bool) -> None:
    """This process waits at a debugger's prompt (True) or runs again (False); a no-op without the core."""
    try:
        from mlx_jupyter import _core
    except ImportError:  # the native core is not built: no collective of ours can wait on us
        return
    set_core_paused: Callable[[bool], None] = getattr(_core, "_set_paused")  # private: not in nanobind's stubs
    set_core_paused(bool(paused))
