"""Every use of the engine kernel's private API (ipykernel, ipyparallel's engine kernel), in one place.

Checked when a rank's agent is installed (:func:`check_kernel`); a kernel that lacks one
of these fails the cluster's start with a message naming the fix, rather than running
without it. Pinned in pyproject.toml to the versions tested. ipykernel's ``OutStream``
internals are used by :mod:`mlx_jupyter.cluster.shared.kernel_streams`, only where present.
"""

from __future__ import annotations

from typing import Any

#: how to get a kernel whose internals this package uses (named in every compat error)
KERNEL_FIX = "install ipykernel 7.x and ipyparallel 9.x: pip install 'ipykernel>=7,<8' 'ipyparallel>=9,<10'"

#: what the agent and the cell channel use: the shell and its session, the request handler
#: tables (abort and status requests, tracked apply requests), ipyparallel's set of aborted
#: requests and its "aborted" reply, ipykernel's lock that runs one shell request at a
#: time (without it a direct-channel cell could overtake a %px request), and its input
#: forwarding, switched around a channel cell as do_execute does (:mod:`.cell_runner`)
KERNEL_NEEDS = ("shell", "session", "control_handlers", "shell_handlers", "aborted", "_send_abort_reply",
                "_main_asyncio_lock", "_forward_input", "_restore_input")


def _versions() -> str:
    found = []
    for name in ("ipykernel", "ipyparallel"):
        try:
            module = __import__(name)
            found.append(f"{name} {getattr(module, '__version__', '?')}")
        except ImportError:
            found.append(f"no {name}")
    return ", ".join(found)


def kernel_problems(kernel: Any) -> list[str]:
    """The kernel internals this package needs that ``kernel`` lacks (``[]``: none)."""
    return [name for name in KERNEL_NEEDS if not hasattr(kernel, name)]


def check_kernel(kernel: Any) -> None:
    """Raise RuntimeError naming what is missing if the agent cannot work with ``kernel``."""
    missing = kernel_problems(kernel)
    if missing:
        raise RuntimeError(f"the engine's kernel has no {', '.join(missing)} ({_versions()}); {KERNEL_FIX}")


def main_lock(kernel: Any) -> Any:
    """ipykernel's lock around each shell request: a cell holding it runs alone."""
    return kernel._main_asyncio_lock


def send_abort_reply(kernel: Any, stream: Any, parent: dict[str, Any], ident: Any) -> Any:
    """Answer ``parent`` "aborted", as the kernel does for a request aborted while queued."""
    return kernel._send_abort_reply(stream, parent, ident)
