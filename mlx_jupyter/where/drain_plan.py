"""Which MLX collectives each stopped rank must make so that its blocked peers' ops complete (a drain). Pure.

Input: each rank's pending state (:func:`mlx_jupyter.cluster.rank.drain.pending_state`): whether it still
runs the cell and is frozen in native code, per group label the collectives it made (``made``) and those
of them it never evaluated (``unrun``: never scheduled on its stream), and its newest calls
``[label, seq, op, dtype, shape]``. Output: a :class:`Plan`: wait, nothing to do, the calls per rank, or
why it cannot be done (the caller then shuts MLX's world down as before, saying that one line).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Collection, Mapping, Sequence

#: one collective to make: (group label, sequence number, op, dtype name, shape)
Call = tuple[str, int, str, str, tuple[int, ...]]


@dataclass
class Plan:
    """``wait``: ask again (a rank still runs Python, or the blocked ranks may finish by themselves: ``why``
    then says what to tell them if they do not); ``calls``: rank -> the collectives it makes, in order;
    ``why``: the one line saying why no drain is possible; ``frozen``: the ranks blocked in native code."""

    wait: bool = False
    calls: dict[int, list[Call]] = field(default_factory=dict)
    why: str = ""
    frozen: list[int] = field(default_factory=list)


def _label(ranks: Collection[int]) -> str:
    rs = sorted(ranks)
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


def _kind(call: Sequence[Any]) -> tuple[str, str, tuple[int, ...]]:
    return str(call[2]), str(call[3]), tuple(int(n) for n in (call[4] or ()))


def plan(states: Mapping[int, Mapping[str, Any]], ranks: Sequence[int], dead: Collection[int] = (),
         ops: Collection[str] = ("all_sum", "all_gather", "all_max", "all_min", "sum_scatter")) -> Plan:
    """The drain for a run over ``ranks`` (see the module docstring); ``ops``: those the backend can make."""
    gone = [r for r in ranks if r in dead]
    if gone:
        return Plan(why=f"{_label(gone)} died, so its collectives cannot be made for it; restart the ranks")
    silent = [r for r in ranks if r not in states]
    if silent:   # asked again until the caller gives up (a loaded machine), then this is why
        return Plan(wait=True, why=f"{_label(silent)} did not answer the drain's question in time",
                    frozen=[r for r, st in states.items() if st.get("frozen")])
    running = [r for r in ranks if states[r].get("executing")]
    if not running:
        return Plan()
    if any(not states[r].get("frozen") for r in running):
        return Plan(wait=True)
    frozen = sorted(running)
    ran = {r: _ran(states[r]) for r in ranks}
    p2p = [r for r in frozen if any(":" in k and v for k, v in ran[r].items())]
    labels = sorted({k for r in ranks for k in ran[r] if ":" not in k})
    calls: dict[int, list[Call]] = {}
    for label in labels:
        members = [r for r in ranks if label in (states[r].get("groups") or {}) or label in ran[r]]
        every = set().union(*(ran[r].get(label, set()) for r in members))
        for r in members:
            mine = ran[r].get(label, set())
            missing = sorted(every - mine)
            if not missing:
                continue
            if r in frozen:
                why = (f"{_label([r])} is blocked in another collective than its peers on `{label}`; "
                       "the collectives differ across ranks")
                ahead = [q for q in members if set(missing) & ran[q].get(label, set())]
                if any(states[q].get("executing") for q in ahead):
                    # the states are asked one by one: a ring rank leaves an op before its peers do and may
                    # already wait in the next while this one finishes the last; ask again before judging
                    return Plan(wait=True, why=why, frozen=frozen)
                return Plan(why=why, frozen=frozen)
            if mine and max(mine) > missing[0]:   # it ran a later one: the ranks paired them differently
                return Plan(why=f"rank {r} ran its collectives on `{label}` in another order than its peers "
                                f"(#{max(mine)} before #{missing[0]})", frozen=frozen)
            for seq in missing:
                made = _the_call(states, members, label, seq)
                if isinstance(made, str):
                    return Plan(why=made, frozen=frozen)
                if made[2] not in ops:
                    return Plan(why=f"`{made[2]}` cannot be drained on this backend", frozen=frozen)
                calls.setdefault(r, []).append(made)
    if not calls:
        if p2p:
            return Plan(why=f"{_label(frozen)}: a send/recv is waiting with no matching partner", frozen=frozen)
        # every rank joined every collective: a slow one ends by itself; ask again until the caller gives up
        return Plan(wait=True, frozen=frozen,
                    why=f"{_label(frozen)}: no rank is behind in MLX's collectives, yet the blocked ranks did not "
                        "finish (native code the record does not show)")
    if any(len({c[0] for c in cs}) > 1 for cs in calls.values()):
        return Plan(why="collectives are pending on several groups at once; their order is unknown", frozen=frozen)
    return Plan(calls=calls, frozen=frozen)


def _ran(state: Mapping[str, Any]) -> dict[str, set[int]]:
    """Per group label, the numbers of the collectives a rank ran (or runs now): those it made, less
    those it never evaluated. MLX runs one evaluation's ops in the order they were made, so the
    numbers are also the order on the stream."""
    unrun = {str(k): set(v) for k, v in (state.get("unrun") or {}).items()}
    return {str(k): set(range(1, int(v) + 1)) - unrun.get(str(k), set()) for k, v in (state.get("made") or {}).items()}


def _the_call(states: Mapping[int, Mapping[str, Any]], members: Sequence[int], label: str,
              seq: int) -> "Call | str":
    """Collective ``seq`` of ``label`` as the ranks that made it recorded it; or why it cannot be made."""
    seen: dict[int, tuple[str, str, tuple[int, ...]]] = {}
    for r in members:
        for call in states[r].get("calls") or ():
            if call[0] == label and int(call[1]) == seq:
                seen[r] = _kind(call)
    if not seen:
        return f"collective #{seq} on `{label}` is older than the record keeps; it cannot be made again"
    kinds = set(seen.values())
    if len(kinds) > 1:
        said = "; ".join(f"{op} {dtype} {list(shape)} on rank {r}" for r, (op, dtype, shape) in sorted(seen.items()))
        return f"collective #{seq} on `{label}` differs across ranks ({said})"
    op, dtype, shape = kinds.pop()
    return (label, seq, op, dtype, shape)


def describe(calls: Mapping[int, Sequence[Call]]) -> str:
    """``rank 1 made all_sum #3 on `world``` (the drain, in words)."""
    parts = []
    for r, cs in sorted(calls.items()):
        made = ", ".join(f"{c[2]} #{c[1]}" for c in cs)
        parts.append(f"rank {r} made {made} on `{cs[0][0]}`")
    return "; ".join(parts)
