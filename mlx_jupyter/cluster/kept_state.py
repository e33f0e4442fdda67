"""A restart that keeps the ranks' state, from the notebook's side: each old rank saves its user
names into a file on its own host (:mod:`mlx_jupyter.cluster.rank.keep`), the new rank of the same
number restores them, and one line says what was kept and what was not, and why.

No data passes through the notebook: it only chooses the folder's random name and reads the
ranks' short answers.
"""

from __future__ import annotations

import secrets
from typing import Any, Callable, Optional

from mlx_jupyter.cluster.cells.text import rank_label
from mlx_jupyter.cluster.shared.errors import ClusterError


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def report_line(saved: dict[int, dict], restored: dict[int, dict], lost: dict[int, str]) -> str:
    """One line: how many names came back on how many ranks (and their size), and each name that
    did not, with why and, when not on every rank, where. ``lost``: rank -> why it kept nothing."""
    ranks = sorted(set(saved) | set(lost))
    kept = {n for r in restored.values() for n in r.get("restored", [])}
    size = sum(s.get("bytes", 0) for s in saved.values())
    why: dict[tuple[str, str], list[int]] = {}
    for r, s in saved.items():
        for name, reason in s.get("not_kept", {}).items():
            why.setdefault((name, reason), []).append(r)
    for r, s in restored.items():
        for name, reason in s.get("failed", {}).items():
            why.setdefault((name, reason), []).append(r)
    parts = []
    for (name, reason), where in sorted(why.items()):
        on = "" if len(where) == len(ranks) else f" on {rank_label(where)}"
        parts.append(f"{name}{on} ({reason})")
    for r, reason in sorted(lost.items()):
        parts.append(f"everything on rank {r} ({reason})")
    names = f"{len(kept)} name{'' if len(kept) == 1 else 's'}"
    ranks_ = f"{len(restored)} rank{'' if len(restored) == 1 else 's'}"
    line = f"restart: kept {names} on {ranks_} ({format_bytes(size)})"
    return line + ("; not kept: " + ", ".join(parts) if parts else "")


class KeptState:
    """One keep-state restart of ``cluster``: :meth:`save` on the old ranks, :meth:`restore` on the new."""

    def __init__(self, cluster: Any, timeout: float = 120.0) -> None:
        self.cluster = cluster
        self.timeout = timeout
        self.dirname = f"mlx-jupyter-keep-{cluster.cluster_id}-{secrets.token_hex(8)}"
        self.saved: dict[int, dict] = {}
        self.lost: dict[int, str] = {}

    def _each_rank(self, fn: Callable[..., Any], ranks: list[int], what: str) -> dict[int, Any]:
        """``fn(dirname, rank)`` on every rank at once; rank -> answer, or the reason it gave none."""
        link, supervisor = self.cluster.link, self.cluster.supervisor
        pending = {r: link.view([r]).apply_async(fn, self.dirname, r) for r in ranks}
        answers: dict[int, Any] = {}
        for r, ar in pending.items():
            try:
                answers[r] = supervisor.wait(ar, self.timeout, [r], what)[0]
            except ClusterError as exc:
                answers[r] = ClusterError(str(exc).splitlines()[0])
            except Exception as exc:  # noqa: BLE001 - the rank's own error, as one line
                answers[r] = ClusterError(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return answers

    def save(self) -> None:
        """Every live rank saves its names; a dead or silent rank keeps nothing (and says why)."""
        from mlx_jupyter.cluster.rank import keep

        table = self.cluster.table
        alive = [r for r in table.ranks if r not in table.dead]
        for r in table.ranks:
            if r in table.dead:
                self.lost[r] = "the rank had died"
        for r, answer in self._each_rank(keep.save, alive, "saving the ranks' names").items():
            if isinstance(answer, ClusterError):
                self.lost[r] = f"saving failed: {answer}"
            else:
                self.saved[r] = answer

    def restore(self) -> str:
        """The new ranks read their old rank's names; the one-line report."""
        from mlx_jupyter.cluster.rank import keep

        restored: dict[int, dict] = {}
        for r, answer in self._each_rank(keep.restore, sorted(self.saved), "restoring the ranks' names").items():
            if isinstance(answer, ClusterError):
                self.lost[r] = f"restoring failed: {answer}"
                self.saved.pop(r, None)
            else:
                restored[r] = answer
        return report_line(self.saved, restored, self.lost)

    def cleanup(self) -> None:
        """Remove the folder wherever this machine can: here, for local ranks (the ranks remove
        their own files after restoring; see :func:`mlx_jupyter.cluster.rank.keep.restore`)."""
        from mlx_jupyter.cluster.rank import keep

        if self.cluster.local:
            keep.remove_all(self.dirname)


def restart_keeping(cluster: Any, restart: Callable[[], None], timeout: Optional[float] = None) -> str:
    """Save, ``restart()`` the processes, restore; the report line. The folder is removed even if
    the restart fails."""
    state = KeptState(cluster, timeout or 120.0)
    try:
        state.save()
        restart()
        return state.restore()
    finally:
        state.cleanup()
