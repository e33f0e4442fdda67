"""The one line a keep-state restart ends with: how many names came back on how many ranks (and
their size), which new groups they hold, what each dead rank got, and each name that did not come
back, with why (:class:`~.kept_state.KeptState` gathers what it says)."""

from __future__ import annotations

from typing import Any, Optional

from mlx_jupyter.cluster.cells.text import rank_label
from mlx_jupyter.cluster.shared.units import format_bytes


def report_line(saved: dict[int, dict[str, Any]], restored: dict[int, dict[str, Any]], lost: dict[int, str],
                imported: Optional[dict[int, list[str]]] = None, peers: Optional[list[str]] = None) -> str:
    """One line: how many names came back on how many ranks (and their size), and each name that
    did not, with why and, when not on every rank, where. ``lost``: rank -> why it kept nothing;
    ``imported``: such a rank -> the other ranks' imports it was given; ``peers``: what each rank
    that died got from its peers (:mod:`.peer_restore`)."""
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
        got = (imported or {}).get(r)
        redone = f"; its imports were redone: {', '.join(got)}" if got else ""
        parts.append(f"everything on rank {r} ({reason}{redone})")
    names = f"{len(kept)} name{'' if len(kept) == 1 else 's'}"
    ranks_ = f"{len(restored)} rank{'' if len(restored) == 1 else 's'}"
    line = f"restart: kept {names} on {ranks_} ({format_bytes(size)})"
    renewed = {(n, k) for r, s in saved.items() for n, k in s.get("renewed", {}).items()
               if n in restored.get(r, {}).get("restored", [])}
    for kind, words in (("world", "MLX's new world"), ("group", "our core's new group")):
        held = sorted(n for n, k in renewed if k == kind)
        if held:
            line += f"; {', '.join(held)} now {'holds' if len(held) == 1 else 'hold'} {words}"
    for clause in peers or []:
        line += f"; {clause}"
    return line + ("; not kept: " + ", ".join(parts) if parts else "")
