"""Whose a listed cluster is, in words: this server's panel, one of its notebooks, or another process.

Clusters are published by every process of the user that starts one (registry), so the panel also
sees those of other Jupyter servers and scripts; it shows them apart, labelled here.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Optional

#: this server's kernels: pid -> the path of the notebook (or console) using it ("" when unknown)
KernelPids = Callable[[], Awaitable[dict[int, str]]]


def _is_kernel(pid: int) -> bool:
    """Whether ``pid`` runs an IPython kernel (its command line names ipykernel)."""
    try:
        import psutil

        return any("ipykernel" in part for part in psutil.Process(pid).cmdline())
    except Exception:   # gone, not ours to read, or no psutil: say "process"
        return False


def label_owner(item: dict[str, Any], kernels: Optional[dict[int, str]]) -> dict[str, Any]:
    """``owner_kind`` ("notebook": a kernel of this server; "other": anything else) and
    ``owner_text`` for a cluster a kernel or another process published. ``kernels`` None:
    this server's kernels are unknown, and every owner is named by its pid alone."""
    pid = int(item.get("owner_pid") or 0)
    if kernels is not None and pid in kernels:
        path = kernels[pid]
        text = f"started by {path}" if path else "started by a notebook of this server"
        return {"owner_kind": "notebook", "owner_text": f"{text} (kernel pid {pid})", "notebook": path}
    if kernels is None:
        return {"owner_kind": "notebook", "owner_text": f"started by kernel pid {pid}"}
    what = "another notebook's cluster (kernel pid" if _is_kernel(pid) else "another process's cluster (pid"
    return {"owner_kind": "other", "owner_text": f"{what} {pid})"}


def server_kernels(server_app: Any) -> KernelPids:
    """This server's kernels as :data:`KernelPids`: each local kernel's pid and its session's path."""

    async def kernels() -> dict[int, str]:
        paths: dict[str, str] = {}
        sessions = getattr(server_app, "session_manager", None)
        if sessions is not None:
            for s in await sessions.list_sessions():
                kernel = s.get("kernel") or {}
                paths[str(kernel.get("id"))] = str(s.get("path") or s.get("name") or "")
        out: dict[int, str] = {}
        km = server_app.kernel_manager
        for kid in km.list_kernel_ids():
            provisioner = getattr(km.get_kernel(kid), "provisioner", None)
            pid = getattr(provisioner, "pid", None)   # a local kernel's process (jupyter_client's LocalProvisioner)
            if pid:
                out[int(pid)] = paths.get(kid, "")
        return out

    return kernels
