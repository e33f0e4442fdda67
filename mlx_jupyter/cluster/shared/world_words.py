"""MLX's `world` shut down, in words: the one wording of the cell's refusal, the notebook's mark on every rank and
the lab panel's and dashboard's line (issue 45 §6: the same facts in the same words everywhere)."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence


def reason(ranks: str, why: str) -> str:
    """``shut down on rank 0 after: rank 1 raised ZeroDivisionError: ...`` (``ranks``: ``rank 0``, ``ranks 0-1``)."""
    return f"shut down on {ranks} after: {why}"


def shut_down(why: str) -> str:
    """``MLX's `world` is shut down (shut down on rank 0 after: ...)``."""
    return f"MLX's `world` is shut down ({why})"


def of_samples(samples: Mapping[int, Mapping[str, object]], label: Callable[[Sequence[int]], str]) -> str:
    """The reason MLX's world is shut down, from the ranks' where samples ("" while it is not): a rank's mark (every
    rank learns it before the next cell) or, before that, where it was shut down and why (``label``: ranks in words,
    the cell's ``rank_label``)."""
    for r in sorted(samples):
        dead = samples[r].get("world_dead")
        if isinstance(dead, str) and dead:
            return dead
    closed = {r: s.get("world_closed") for r, s in samples.items() if isinstance(s.get("world_closed"), str)
              and s.get("world_closed")}
    if not closed:
        return ""
    ranks = sorted(closed)
    return reason(label(ranks), str(closed[ranks[0]]))
