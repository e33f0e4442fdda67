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
    ``why``: the one line saying why no drain is possible; ``frozen``: the ranks blocked in native code;
    ``busy``: every rank joined every collective with the same op, dtype and shape, so the frozen ranks
    evaluate together (a long prefill) and may end by themselves."""

    wait: bool = False
    calls: dict[int, list[Call]] = field(default_factory=dict)
    why: str = ""
    frozen: list[int] = field(default_factory=list)
    busy: bool = False


def rank_words(ranks: Collection[int]) -> str:
    rs = sorted(ranks)
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(map(str, rs))


def _kind(call: Sequence[Any]) -> tuple[str, str, tuple[int, ...]]:
    return str(call[2]), str(call[3]), tuple(int(n) for n in (call[4] or ()))


def plan(states: Mapping[int, Mapping[str, Any]], ranks: Sequence[int], dead: Collection[int] = (),
         ops: Collection[str] = ("all_sum", "all_gather", "all_max", "all_min", "sum_scatter")) -> Plan:
    """The drain for a run over ``ranks`` (see the module docstring); ``ops``: those the backend can make."""
    gone = [r for r in ranks if r in dead]
    if gone:
        return Plan(why=f"{rank_words(gone)} died, so its collectives cannot be made for it; restart the ranks")
    silent = [r for r in ranks if r not in states]
    if silent:   # asked again until the caller gives up (a loaded machine), then this is why
        return Plan(wait=True, why=f"{rank_words(silent)} did not answer the drain's question in time",
                    frozen=[r for r, st in states.items() if st.get("frozen")])
    running = [r for r in ranks if states[r].get("executing")]
    # a rank whose cell ended while its stream still runs a call (MLX evaluates asynchronously: mlx-lm's
    # async_eval) is blocked there as surely as a frozen one
    streaming = [r for r in ranks if not states[r].get("executing") and any((states[r].get("inflight") or {}).values())]
    if not running and not streaming:
        return Plan()
    if any(not states[r].get("frozen") for r in running):
        return Plan(wait=True)
    frozen = sorted(running + streaming)
    differ = _differing(states, ranks)
    if differ:   # MLX's ring can let one side finish a mismatched pair: nothing pairs with what is left
        return Plan(why=differ, frozen=frozen)
    ran = {r: _ran(states[r]) for r in ranks}
    calls: dict[int, list[tuple[tuple[int, int], Call]]] = {}   # rank -> (its place in another's record, call)
    for key in sorted({k for r in ranks for k in ran[r]}):
        members = _members(key, states, ran, ranks)
        every = set().union(*(ran[r].get(key, set()) for r in members))
        for r in members:
            mine = ran[r].get(key, set())
            missing = sorted(every - mine)
            if not missing:
                continue
            if r in frozen:
                what = "send/recv" if ":" in key else "collective"
                why = (f"{rank_words([r])} is blocked in another {what} than its peers on `{key}`; "
                       f"the {what}s differ across ranks")
                ahead = [q for q in members if set(missing) & ran[q].get(key, set())]
                if any(states[q].get("executing") for q in ahead):
                    # the states are asked one by one: a ring rank leaves an op before its peers do and may
                    # already wait in the next while this one finishes the last; ask again before judging
                    return Plan(wait=True, why=why, frozen=frozen)
                return Plan(why=why, frozen=frozen)
            if mine and max(mine) > missing[0]:   # it ran a later one: the ranks paired them differently
                return Plan(why=f"rank {r} ran its collectives on `{key}` in another order than its peers "
                                f"(#{max(mine)} before #{missing[0]})", frozen=frozen)
            for seq in missing:
                made = _the_call(states, members, key, seq, r)
                if isinstance(made, str):
                    return Plan(why=made, frozen=frozen)
                if made[1][2] not in ops:
                    return Plan(why=f"`{made[1][2]}` cannot be drained on this backend", frozen=frozen)
                calls.setdefault(r, []).append(made)
    if not calls:
        # every rank joined every call: a slow one ends by itself; ask again until the caller gives up
        return Plan(wait=True, frozen=frozen, busy=True,
                    why=f"{rank_words(frozen)}: no rank is behind in MLX's collectives, yet the blocked ranks did not "
                        "finish (native code the record does not show)")
    ordered: dict[int, list[Call]] = {}
    for r, placed in calls.items():
        # several keys: made in the order one other rank's record shows them (MLX runs them in that order)
        if len({c[0] for _, c in placed}) > 1 and len({at[0] for at, _ in placed}) > 1:
            return Plan(why="calls are pending on several groups at once; their order is unknown", frozen=frozen)
        ordered[r] = [c for _, c in sorted(placed, key=lambda pc: (pc[0], pc[1][1]))]
    return Plan(calls=ordered, frozen=frozen)


def with_drained(states: Mapping[int, Mapping[str, Any]],
                 drained: Mapping[int, Sequence[Call]]) -> dict[int, Mapping[str, Any]]:
    """``states`` with the calls an earlier drain round made counted as made and run by their ranks (a drain
    calls MLX's own functions, which the ranks' records do not see)."""
    out: dict[int, Mapping[str, Any]] = dict(states)
    for rank, calls in drained.items():
        if rank not in out or not calls:
            continue
        made = {str(k): int(v) for k, v in (out[rank].get("made") or {}).items()}
        unrun = {str(k): list(v) for k, v in (out[rank].get("unrun") or {}).items()}
        for key, seq, *_ in calls:
            made[key] = max(made.get(key, 0), int(seq))
            unrun[key] = [n for n in unrun.get(key, []) if n != seq]
        out[rank] = {**out[rank], "made": made, "unrun": unrun}
    return out


def _differing(states: Mapping[int, Mapping[str, Any]], ranks: Sequence[int]) -> str:
    """Why one call number of a group differs across the ranks' records (op, dtype or shape), or ""."""
    seen: dict[tuple[str, int], dict[int, tuple[str, str, tuple[int, ...]]]] = {}
    for r in ranks:
        for call in states[r].get("calls") or ():
            if ":" not in str(call[0]):
                seen.setdefault((str(call[0]), int(call[1])), {})[r] = _kind(call)
    for (key, seq), kinds in sorted(seen.items()):
        if len(set(kinds.values())) > 1:
            return _differs("collective", key, seq, kinds)
    return ""


def _differs(what: str, key: str, seq: int, kinds: Mapping[int, tuple[str, str, tuple[int, ...]]]) -> str:
    """``collective #1 on `world` differs across ranks (all_sum float32 [4] on rank 0; ...)``."""
    said = "; ".join(f"{op} {dtype} {list(shape)} on rank {r}" for r, (op, dtype, shape) in sorted(kinds.items()))
    return f"{what} #{seq} on `{key}` differs across ranks ({said})"


def _members(key: str, states: Mapping[int, Mapping[str, Any]], ran: Mapping[int, Mapping[str, set[int]]],
             ranks: Sequence[int]) -> list[int]:
    """The ranks that take part in ``key``'s calls: a group's members, or a send/recv pair's two ranks."""
    label, _, pair = key.partition(":")
    if pair:
        src, _, dst = pair.partition(">")
        by_group = {int(st.get("groups", {}).get(label, [-1])[0]): r for r, st in states.items()
                    if label in (st.get("groups") or {})}
        return [by_group.get(int(src), int(src)), by_group.get(int(dst), int(dst))]
    return [r for r in ranks if label in (states[r].get("groups") or {}) or key in ran[r]]


def _ran(state: Mapping[str, Any]) -> dict[str, set[int]]:
    """Per key, the numbers of the calls a rank ran (or runs now): those it made, less those it never
    evaluated. MLX runs one evaluation's ops in the order they were made, so the numbers are also the
    order on the stream."""
    unrun = {str(k): set(v) for k, v in (state.get("unrun") or {}).items()}
    return {str(k): set(range(1, int(v) + 1)) - unrun.get(str(k), set()) for k, v in (state.get("made") or {}).items()}


def _the_call(states: Mapping[int, Mapping[str, Any]], members: Sequence[int], key: str,
              seq: int, behind: int) -> "tuple[tuple[int, int], Call] | str":
    """Call ``seq`` of ``key`` for rank ``behind`` to make, as the other ranks recorded it (of a send/recv
    pair, the partner's op), with its place ``(rank, index)`` in the record of the lowest other rank that
    made it (the order to make several in); or why it cannot be made."""
    seen: dict[int, tuple[str, str, tuple[int, ...]]] = {}
    place = (-1, -1)
    for r in members:
        for at, call in enumerate(states[r].get("calls") or ()):
            if call[0] == key and int(call[1]) == seq:
                seen[r] = _kind(call)
                if place[0] < 0 and r != behind:
                    place = (r, at)
    what = "send/recv" if ":" in key else "collective"
    if not seen:
        return f"{what} #{seq} on `{key}` is older than the record keeps; it cannot be made again"
    pair = ":" in key   # a send/recv pair: ``behind`` makes its side of it (members: sender, receiver)
    if len({(d, sh) if pair else (o, d, sh) for o, d, sh in seen.values()}) > 1:
        return _differs(what, key, seq, seen)
    op, dtype, shape = next(iter(seen.values()))
    if pair:
        op = "send" if behind == members[0] else "recv"
    return place, (key, seq, op, dtype, shape)


def describe(calls: Mapping[int, Sequence[Call]]) -> str:
    """``rank 1 made all_sum #3 on `world``` (the drain, in words; each key named after its run of calls)."""
    parts = []
    for r, cs in sorted(calls.items()):
        runs: list[tuple[str, list[str]]] = []
        for c in cs:
            if not runs or runs[-1][0] != c[0]:
                runs.append((c[0], []))
            runs[-1][1].append(f"{c[2]} #{c[1]}")
        parts.append(f"rank {r} made " + ", ".join(f"{', '.join(made)} on `{key}`" for key, made in runs))
    return "; ".join(parts)
