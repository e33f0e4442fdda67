"""Who waits for whom in MLX's own collectives, from the ranks' records (:mod:`.mlx_calls`). Pure.

A rank whose main thread is in MLX's evaluation (``mlx_eval`` in its sample) while a peer of the
group has made fewer collective calls waits, in the first call that peer has not made, on that
peer. Two ranks whose calls of the same number differ (op, dtype or shape) are a mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, TypeAlias

#: the label of the global group (as :mod:`.mlx_calls` names it)
WORLD = "world"
#: seconds a rank's main thread stays at one MLX evaluation, making no call, before it is said to wait there
#: (two samples; a healthy loop passes the line again with new calls). A sample without ``still`` is one look.
STILL = 0.2

#: a rank's where sample (:func:`.sample.take`'s dict, as JSON brings it): line, source, call, mlx_eval, mlx, ...
Sample: TypeAlias = Mapping[str, Any]
#: a rank's record of its MLX collectives (:func:`.mlx_calls.snapshot`): calls, counts, groups
Record: TypeAlias = Mapping[str, Any]
#: one recorded MLX collective call: key, seq, op, dtype, shape, peer, at, via
Call: TypeAlias = Mapping[str, Any]
#: (a rank's call, the peer, the peer's call of the same number) where the two differ
Mismatch: TypeAlias = tuple[Call, int, Call]


@dataclass
class MlxState:
    """A rank's row, from its MLX record: the state in words, the place key and its clause of the diagnosis."""

    state: str
    place: str
    says: str
    waiting: bool = False


def signature(call: Call) -> str:
    """``float32[6]``."""
    shape = call.get("shape")
    return f"{call.get('dtype', '?')}[{','.join(map(str, shape)) if shape is not None else '?'}]"


def _built(call: Call) -> str:
    via = call.get("via")
    return f"built at {call.get('at', '?')}" + (f" through {via.replace('mlx.', '', 1)}" if via else "")


def _what(call: Call) -> str:
    """``all_sum #1``, ``recv #2 from rank 0`` (the peer in the group's numbers)."""
    op = call.get("op", "?")
    peer = call.get("peer")
    if peer is None:
        return f"{op} #{call.get('seq', '?')}"
    return f"{op} #{call.get('seq', '?')} {'to' if op == 'send' else 'from'} rank {peer}"


def _rank_words(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def _at(sample: Sample) -> str:
    """``at line 2: time.sleep(1000)``."""
    line = sample.get("line")
    if line is None:
        return "running"
    source = (sample.get("source") or "").strip()
    return f"at line {line}" + (f": {source[:40]}{'...' if len(source) > 40 else ''}" if source else "")


def _members(key: str, records: Mapping[int, Record], ranks: Sequence[int]) -> list[int]:
    """The ranks (with a record) that take part in ``key``'s calls."""
    if ":" in key:
        label, pair = key.split(":", 1)
        ends = {int(x) for x in pair.split(">")}
        out = []
        for r, rec in records.items():
            grank = (rec.get("groups") or {}).get(label, [r if label == WORLD else None])[0]
            if grank in ends:
                out.append(r)
        return out
    if key == WORLD:
        return [r for r in ranks if r in records]
    return [r for r, rec in records.items() if key in (rec.get("counts") or {})]


def _call(rec: Record, key: str, seq: int) -> Optional[Call]:
    calls: list[Call] = rec.get("calls") or []
    for c in calls:
        if c.get("key") == key and c.get("seq") == seq:
            return c
    return None


def _same(a: Call, b: Call) -> bool:
    if a.get("peer") is not None:   # send and recv: what goes must be what is expected
        return (a.get("dtype"), a.get("shape")) == (b.get("dtype"), b.get("shape"))
    return (a.get("op"), a.get("dtype"), a.get("shape")) == (b.get("op"), b.get("dtype"), b.get("shape"))


def _count_words(key: str, n: int, rank: int, records: Mapping[int, Record]) -> str:
    if ":" not in key:
        group = "" if key == WORLD else f" on group {key}"
        return f"has called {n} MLX collective{'s' if n != 1 else ''}{group}"
    label, pair = key.split(":", 1)
    src, dst = pair.split(">")
    mine = str((records.get(rank, {}).get("groups") or {}).get(label, [rank])[0])
    if mine == src:
        return f"has made {n} MLX send{'s' if n != 1 else ''} to rank {dst}"
    return f"has made {n} MLX recv{'s' if n != 1 else ''} from rank {src}"


def mismatches(records: Mapping[int, Record], ranks: Sequence[int]) -> dict[int, Mismatch]:
    """rank -> (its call, the peer, the peer's call of the same number) where the two differ."""
    out: dict[int, Mismatch] = {}
    for r, rec in records.items():
        for call in reversed(rec.get("calls") or []):
            if r in out:
                break
            key, seq = call.get("key"), call.get("seq")
            for p in _members(key, records, ranks):
                other = _call(records[p], key, seq) if p != r else None
                if other is not None and not _same(call, other):
                    out[r] = (call, p, other)
                    break
    return out


def states(samples: Mapping[int, Sample], ranks: Sequence[int],
           ended: Mapping[int, str]) -> dict[int, MlxState]:
    """The rows the MLX records decide (the rest are the stack's to say)."""
    # a rank that ended its cell keeps its record (its last word): a mismatch on MLX's ring may let it finish
    finished = {r: s["mlx"] for r, s in samples.items() if isinstance(s.get("mlx"), dict) and ended.get(r) == "done"}
    records = {r: s["mlx"] for r, s in samples.items() if isinstance(s.get("mlx"), dict) and r not in ended}
    if not records:
        return {}
    out: dict[int, MlxState] = {}
    evaluates = {r: _evaluates(samples[r], rec) for r, rec in records.items()}
    every = {**finished, **records}
    found: Optional[Mismatch]
    for r, found in sorted(mismatches(every, ranks).items()):
        if r not in records:
            continue
        s, mine = samples[r], evaluates[r]
        if mine is not None and mine is not found[0]:   # it evaluates another call than the one that differs
            found = _mismatch_of(r, mine, every, ranks)
            if found is None:
                continue   # it waits in a call that matches: the wait's words below
        call, p, other = found
        evaluated = f", evaluated at line {s['line']}" if s.get("line") is not None and s.get("mlx_eval") else ""
        theirs = f"rank {p}'s {_what(other)} ({signature(other)}, {_built(other)})"
        if s.get("mlx_eval"):
            state = f"in MLX {_what(call)} ({signature(call)}, {_built(call)}{evaluated}), which does not match {theirs}"
        else:   # it went on (MLX's ring may let one side through): not in it any more
            state = (f"has called MLX {_what(call)} ({signature(call)}, {_built(call)}), which does not match "
                     f"{theirs}, and is {_at(s)}")
        lo, hi = sorted([(r, call), (p, other)], key=lambda x: x[0])
        says = (f"MLX collectives do not match: rank {lo[0]}'s {_what(lo[1])} of {signature(lo[1])} "
                f"({_built(lo[1])}) and rank {hi[0]}'s {_what(hi[1])} of {signature(hi[1])} ({_built(hi[1])})")
        out[r] = MlxState(state, f"mismatch {call.get('key')} #{call.get('seq')}", says, waiting=True)
    behind: dict[int, str] = {}
    for r in sorted(records):
        if r in out or not samples[r].get("mlx_eval") or samples[r].get("still", STILL) < STILL:
            continue
        waits = _waits(r, samples, records, ranks, ended, evaluates)
        if waits is None:
            continue
        waited, on, key = waits
        s = samples[r]
        evaluated = f", evaluated at line {s['line']}" if s.get("line") is not None else ""
        still = s.get("still")
        lasting = f" for {still:.1f} s" if isinstance(still, (int, float)) and still >= 1 else ""
        what = (f"MLX {_what(waited)} ({signature(waited)}, {_built(waited)}{evaluated})" if waited
                else "MLX's evaluation")
        state = f"waits in {what} on {_rank_words(on)}{lasting}"
        out[r] = MlxState(state, f"waits {key} #{waited.get('seq') if waited else '?'}", f"rank {r} {state}",
                          waiting=True)
        for p in on:
            if p in records and p not in out:
                behind.setdefault(p, _behind_words(p, key, waited, samples, records))
    for p, words in behind.items():
        if p not in out:
            out[p] = MlxState(words, f"behind {p}", f"rank {p} {words}")
    return out


def _evaluates(sample: Sample, rec: Record) -> Optional[Call]:
    """The recorded call the rank's evaluation evaluates, when its sample could tell (``mlx_evaluates``)."""
    told = sample.get("mlx_evaluates")
    if not sample.get("mlx_eval") or not isinstance(told, (list, tuple)) or len(told) != 2:
        return None
    return _call(rec, told[0], told[1])


def _mismatch_of(r: int, call: Call, records: Mapping[int, Record],
                 ranks: Sequence[int]) -> Optional[Mismatch]:
    """(``call``, a peer, its call of the same number) where the two differ; None when none does."""
    for p in _members(call.get("key", ""), records, ranks):
        other = _call(records[p], call.get("key", ""), call.get("seq", -1)) if p != r else None
        if other is not None and not _same(call, other):
            return call, p, other
    return None


def _waits_in(r: int, call: Call, samples: Mapping[int, Sample], records: Mapping[int, Record],
              ranks: Sequence[int], evaluates: Mapping[int, Optional[Call]]) -> Optional[list[int]]:
    """The peers rank ``r`` waits on in ``call``, the one it evaluates: those that have not made it, else
    those not evaluating it (evaluating nothing, or another call: MLX runs its graph in its own order)."""
    key, seq = call.get("key", ""), call.get("seq", 0)
    peers = [p for p in _members(key, records, ranks) if p != r]
    behind = [p for p in peers if (records[p].get("counts") or {}).get(key, 0) < seq]
    if behind:
        return behind
    elsewhere = [p for p in peers if not samples[p].get("mlx_eval")
                 or (evaluates.get(p) is not None and evaluates[p] is not _call(records[p], key, seq))]
    return elsewhere or None


def _waits(r: int, samples: Mapping[int, Sample], records: Mapping[int, Record], ranks: Sequence[int],
           ended: Mapping[int, str], evaluates: Optional[Mapping[int, Optional[Call]]] = None,
           ) -> Optional[tuple[Optional[Call], list[int], str]]:
    """(the call rank ``r`` waits in, the ranks it waits on, its key), or None when no peer is behind."""
    rec = records[r]
    mine = (evaluates or {}).get(r)
    if mine is not None and not any(p in ended and p != r for p in ranks):
        on = _waits_in(r, mine, samples, records, ranks, evaluates or {})
        return (mine, on, mine.get("key", "")) if on else None
    counts = rec.get("counts") or {}
    keys = sorted((k for k, n in counts.items() if n), key=lambda k: (k != WORLD, ":" in k, k))
    for key in keys:
        n = counts[key]
        peers = [p for p in _members(key, records, ranks) if p != r]
        have = {p: (records[p].get("counts") or {}).get(key, 0) for p in peers}
        low = min(have.values(), default=n)
        if low < n:
            return (_call(rec, key, low + 1) or {"op": "collective", "seq": low + 1, "key": key},
                    [p for p, c in have.items() if c == low], key)
    gone = [p for p in ranks if p in ended and p != r]
    if gone and keys:   # a peer that ended makes no more calls
        key = keys[0]
        return _call(rec, key, counts[key]), gone, key
    # every peer made the calls: the last one waits on the peers that are not evaluating it
    last = (rec.get("calls") or [None])[-1]
    if last is None:
        return None
    key = last.get("key")
    idle = [p for p in _members(key, records, ranks) if p != r and not samples[p].get("mlx_eval")]
    return (last, idle, key) if idle else None


def _behind_words(p: int, key: str, call: Optional[Call], samples: Mapping[int, Sample],
                  records: Mapping[int, Record]) -> str:
    n = (records[p].get("counts") or {}).get(key, 0)
    seq = call.get("seq") if call else None
    if isinstance(seq, int) and n >= seq:   # it made the call but is not evaluating it
        mine = _call(records[p], key, seq)
        made = f"has called MLX {_what(mine)} ({_built(mine)})" if mine else f"has called MLX #{seq}"
        return f"{made} but is {_at(samples[p])}, not evaluating it"
    return f"{_count_words(key, n, p, records)} and is {_at(samples[p])}"
