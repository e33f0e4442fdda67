"""Where each rank is, as words: a state per rank, the table, and a one-line diagnosis. Pure.

Input: per rank, the latest sample (:mod:`.sample`: line, source, call, activity, CPU, memory)
and how its cell ended, if it did (``done``, ``raised``, ``dead``). Output: :class:`RankRow` rows,
a text and an HTML table, and :func:`diagnosis` when the ranks are in different places.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Collection, Mapping, Optional, Sequence, TypeAlias

from mlx_jupyter.where import mlx_model
from mlx_jupyter.where.mlx_model import Sample

#: how a rank's cell ended, as the table says it
ENDED = ("done", "raised", "dead", "released", "no reply")
#: MLX calls in which a rank waits for its peers (a rank blocked there waits on the others)
MLX_WAITS = ("mx.eval", "mx.distributed.", "mx.async_eval")
#: our API's collectives (the stack shows the call by name)
COLLECTIVES = ("all_sum", "all_gather", "all_max", "all_min", "all_reduce", "send", "recv", "barrier",
               "broadcast", "reduce_scatter", "sum_scatter")
#: one of our core's activity records in a sample's ``activity``: op, state, seq, elapsed, waiting_on, group, timeout
Activity: TypeAlias = Mapping[str, Any]


def format_bytes(n: Optional[float]) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


@dataclass
class RankRow:
    """One rank in the table: its state in words and the place that the diagnosis compares."""

    rank: int
    state: str
    place: str        # "" when unknown; ranks in the same place are said together
    cpu: str = "?"
    memory: str = "?"
    waiting: bool = False
    says: str = ""    # the diagnosis's clause for this rank when it is not "rank N is <state>" (MLX's record)


def _op_activity(sample: Sample) -> Optional[Activity]:
    """The collective this rank is in, from our core's activity record (None: none running)."""
    activity: list[Activity] = sample.get("activity") or []
    for a in activity:
        if a.get("state") in ("running", "waiting") and a.get("op"):
            return a
    return None


def _collective_call(sample: Sample) -> Optional[str]:
    """The blocking collective the stack shows (``dist.all_sum``, ``mx.eval``), if any."""
    call = sample.get("call") or ""
    if call.startswith(MLX_WAITS):
        return call
    name = call.rsplit(".", 1)[-1]
    if call.startswith(("dist.", "core.")) and any(name.startswith(c) for c in COLLECTIVES):
        return name
    return None


def place_of(sample: Sample) -> tuple[str, str]:
    """(where in words, the key ranks at the same place share)."""
    line = sample.get("line")
    at = f" at line {line}" if line is not None else ""
    op = _op_activity(sample)
    if op is not None:
        what = f"in {op['op']} #{op.get('seq', '?')}"
        return what + at, what + at
    coll = _collective_call(sample)
    if coll is not None:
        return f"in {coll}{at}", f"in {coll}{at}"
    call = sample.get("call")
    if line is None:
        return ("running" + (f" in {call}" if call else ""), "")
    return f"at line {line}" + (f" in {call}" if call else ""), f"at line {line}"


def rows(samples: Mapping[int, Sample], ended: Mapping[int, str], ranks: Sequence[int],
         now: Optional[float] = None) -> list[RankRow]:
    """A row per rank of ``ranks``: its end (``ended``) or what its sample says."""
    live = {r: samples[r] for r in ranks
            if r in samples and r not in ended and samples[r].get("running") is not False}
    in_pdb = {r for r, s in live.items() if s.get("debugger")}
    # a rank at a pdb prompt is there, whatever line it stopped at (the same as a waiting rank's, maybe)
    places = {r: _pdb_place(s) if r in in_pdb else place_of(s) for r, s in live.items()}
    done = {r: samples[r] for r in ranks if ended.get(r) == "done" and r in samples}  # their last MLX record
    mlx = mlx_model.states({**done, **{r: s for r, s in live.items() if r not in in_pdb}}, ranks, ended)
    places.update({r: (m.state, m.place) for r, m in mlx.items()})
    out = []
    for r in ranks:
        s = samples.get(r) or {}
        cpu = f"{s['cpu']:.0f}%" if isinstance(s.get("cpu"), (int, float)) else "?"
        mem = format_bytes(s.get("rss")) if s.get("rss") else "?"
        if r in ended:
            out.append(RankRow(r, ended[r], ended[r], cpu if ended[r] != "dead" else "-", mem))
            continue
        if s and s.get("running") is False:
            out.append(RankRow(r, "idle", "idle", cpu, mem))
            continue
        if r not in places:
            out.append(RankRow(r, "running (no sample yet)", "", cpu, mem))
            continue
        if r in in_pdb:
            out.append(RankRow(r, places[r][0], places[r][1], cpu, mem))
            continue
        if r in mlx:
            m = mlx[r]
            out.append(RankRow(r, m.state, m.place, cpu, mem, waiting=m.waiting, says=m.says))
            continue
        words, key = places[r]
        op = _op_activity(s)
        coll = op is not None or _collective_call(s) is not None
        state = words if coll else (f"running line {s['line']}" + _source_note(s)
                                    if s.get("line") is not None else words)
        if coll:
            waiting_on = _waiting_on(r, s, op, places, key, ranks, ended, in_pdb)
            if waiting_on:
                state += f" waiting on {waiting_on}"
            elapsed = op.get("elapsed") if op is not None else None
            if isinstance(elapsed, (int, float)):
                state += f" for {elapsed:.1f} s"
            if in_pdb:  # a debug session has no timeout of its own; the collectives waiting on it do
                state += "; " + timeout_words(op)
        out.append(RankRow(r, state, key, cpu, mem, waiting=coll))
    return out


def waits_on_peer(row: RankRow) -> bool:
    """The row says the rank waits on a peer: our core's or the stack's ``waiting on``, MLX's record's
    ``waits in ... on rank 1`` or a mismatch."""
    return " waiting on " in row.state or bool(row.says and row.waiting)


def _pdb_place(sample: Sample) -> tuple[str, str]:
    state = debugger_state(sample["debugger"])
    return state, state


def debugger_state(debugger: Mapping[str, Any]) -> str:
    """``in pdb (line 4)``, ``in pdb post-mortem (line 3 in scale)``."""
    func = debugger.get("func")
    where = f"line {debugger.get('line', '?')}" + (f" in {func}" if func and func != "<module>" else "")
    return f"in pdb{' post-mortem' if debugger.get('post_mortem') else ''} ({where})"


def timeout_words(op: Optional[Activity]) -> str:
    """When the wait of ``op`` (our core's record; None: an MLX call seen on the stack) ends by itself."""
    if op is None or str(op.get("group", "")).startswith("mlx-"):
        return "no timeout (MLX's collectives have none; the stop button ends the wait)"
    timeout = op.get("timeout")
    if isinstance(timeout, (int, float)):
        return f"times out after {timeout:g} s"
    return "no timeout set (timeout= or MLX_JUPYTER_TIMEOUT; the stop button ends the wait)"


def _source_note(sample: Sample) -> str:
    """``: time.sleep(5)`` (the line's source, short), or the call it is in."""
    source = (sample.get("source") or "").strip()
    if source:
        return f": {source[:40]}" + ("..." if len(source) > 40 else "")
    return f" in {sample['call']}" if sample.get("call") else ""


def _waiting_on(rank: int, sample: Sample, op: Optional[Activity], places: Mapping[int, tuple[str, str]],
                key: str, ranks: Sequence[int], ended: Mapping[int, str], in_pdb: Collection[int] = ()) -> str:
    """``rank j`` (the core's record says, or the ranks not at this collective), ``(in pdb)`` if it is."""
    if op is not None and op.get("waiting_on") is not None:
        others = [int(op["waiting_on"])]
    else:
        others = [r for r in ranks if r != rank and (r in ended or places.get(r, ("", ""))[1] != key)]
    if not others:
        return ""
    debugging = [r for r in others if r in in_pdb]
    if not debugging:
        return rank_words(others)
    if debugging == others:
        return f"{rank_words(others)} (in pdb)"
    return f"{rank_words(others)} ({rank_words(debugging)} in pdb)"


def rank_words(ranks: Sequence[int]) -> str:
    """``rank 1``, ``ranks 0 and 2``, ``ranks 0, 1 and 3``."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def diagnosis(table: Sequence[RankRow]) -> str:
    """One line when the ranks are in different places ("" when together or unknown)."""
    groups: dict[str, list[RankRow]] = {}
    for row in table:
        groups.setdefault(row.place or f"?{row.rank}", []).append(row)
    if not any(row.waiting for row in table) or len(groups) < 2 and not any(row.says for row in table):
        return ""
    parts = []
    for row in table:   # MLX's record: each rank says its own clause (a mismatch's is the same on both ranks)
        if row.says and row.says not in parts:
            parts.append(row.says)
    for rows_at in sorted(groups.values(), key=lambda rs: (not rs[0].waiting, rs[0].rank)):
        if rows_at[0].says:
            continue
        who = rank_words([r.rank for r in rows_at])
        verb = "is" if len(rows_at) == 1 else "are"
        state = rows_at[0].state if len(rows_at) == 1 else rows_at[0].state.split(" waiting on ")[0]
        state = state.replace("running line", "at line", 1)
        parts.append(f"{who} {verb} {state}")
    return "; ".join(parts)


COLUMNS = ("rank", "state", "cpu", "memory")


def text_table(table: Sequence[RankRow], title: str = "") -> str:
    cells = [COLUMNS] + [(str(r.rank), r.state, r.cpu, r.memory) for r in table]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip() for c in cells]
    note = diagnosis(table)
    return "\n".join(([title] if title else []) + lines + ([note] if note else []))


def html_table(table: Sequence[RankRow], title: str = "") -> str:
    head = "".join(f"<th style='text-align:left'>{c}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{html.escape(v)}</td>"
                                    for v in (str(r.rank), r.state, r.cpu, r.memory)) + "</tr>" for r in table)
    note = diagnosis(table)
    return ((f"<div class='mlxj-where-title'>{html.escape(title)}</div>" if title else "")
            + f"<table class='mlxj-where'><tr>{head}</tr>{body}</table>"
            + (f"<div class='mlxj-where-diagnosis'><b>{html.escape(note)}</b></div>" if note else ""))


def bundle(table: Sequence[RankRow], title: str = "") -> dict[str, str]:
    """The display bundle: text and HTML."""
    return {"text/plain": text_table(table, title), "text/html": html_table(table, title)}


class Where:
    """Where every rank is now (``Cluster.where()``): ``rows``, ``diagnosis``; shown as a table."""

    def __init__(self, table: Sequence[RankRow], title: str = ""):
        self.rows = list(table)
        self.title = title
        self.diagnosis = diagnosis(self.rows)

    def __str__(self) -> str:
        return text_table(self.rows, self.title)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        return html_table(self.rows, self.title)

    def state(self, rank: int) -> str:
        """Rank ``rank``'s state in words."""
        return next(r.state for r in self.rows if r.rank == rank)
