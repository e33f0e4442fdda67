"""A profile's records and what is drawn from them: the text summary and the timeline (SVG).

Pure functions of `OpRecord`s, whichever process or rank made them (`core/recording.py` records
them; a cluster gathers them from its ranks). ``wait`` is the time the op had nothing to move,
waiting on its peers (docs/collective-core.md says exactly how it is measured). A record's
``library`` says who made the op: ``mlx_jupyter`` (our core's groups and ``mlx_jupyter.distributed``
on an MLX-backend group) or ``mlx`` (MLX's own ``mx.distributed`` calls, timed by evaluating each
where it is called: :mod:`mlx_jupyter.where.mlx_profile`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Optional
from xml.sax.saxutils import escape

#: collectives: the same ``(group_id, seq)`` on every rank is one call (send/recv are counted per rank)
P2P = ("send", "recv")
#: ``OpRecord.library`` of ours and of MLX's own calls
OURS, MLX = "mlx_jupyter", "mlx"


@dataclass(frozen=True)
class OpRecord:
    """One op on one rank. ``start``/``end``: seconds since the epoch (this rank's clock);
    ``wait``: seconds with nothing to move (None: not measured, MLX's own groups)."""

    group_id: str
    rank: int
    size: int
    op: str
    seq: int
    nbytes: int
    dtype: str
    start: float
    end: float
    wait: Optional[float]
    waited_on: Optional[int] = None  # the peer it waited for last
    ok: bool = True
    library: str = OURS                  # who made it: OURS or MLX
    shape: Optional[tuple[int, ...]] = None  # the input's shape (MLX's calls)
    at: Optional[str] = None             # the call site (MLX's calls): "line 3", "train.py:12 in step"
    timed: bool = True                   # False: called inside mx.compile tracing, no duration (start == end)

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Summary:
    """What a profile says: per-rank wait, the straggler and the slowest calls."""

    ops: int
    ranks: list[int]
    wait_by_rank: dict[int, float]
    time_by_rank: dict[int, float]
    straggler: Optional[int]  # the rank the others waited for most, if they waited noticeably
    caused: dict[int, float]  # rank -> seconds the others waited for it (the wait-free rank of each call)
    slowest: list[list[OpRecord]]  # calls (one record per rank), longest first
    text: str


def calls(records: Iterable[OpRecord]) -> list[list[OpRecord]]:
    """The records grouped into calls: a collective's records of every rank, or one send/recv."""
    by_call: dict[tuple[str, str, int, int], list[OpRecord]] = defaultdict(list)
    for r in records:
        key = (r.group_id, r.op, r.seq, r.rank if r.op in P2P else -1)
        by_call[key].append(r)
    return [sorted(c, key=lambda r: r.rank) for c in by_call.values()]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _s(t: float) -> str:
    return f"{t * 1e3:.3f} ms" if t < 1 else f"{t:.3f} s"


def describe_call(call: list[OpRecord]) -> str:
    """``all_sum #3 (4.0 KiB float32) on core:1: 101.2 ms, rank 0 waited 100.1 ms for rank 1``; MLX's own:
    ``MLX all_sum #2 (4.0 KiB float32 [1024]) on mx:world at line 3: 1.2 ms``."""
    first = call[0]
    what = ("MLX " if first.library == MLX else "") + f"{first.op} #{first.seq}"
    what += f" on rank {first.rank}" if first.op in P2P else ""
    shape = f" [{', '.join(map(str, first.shape))}]" if first.shape is not None else ""
    text = f"{what} ({_size(first.nbytes)} {first.dtype}".rstrip() + f"{shape}) on {first.group_id}"
    text += (f" at {first.at}" if first.at else "") + ": "
    timed = [r for r in call if r.timed]
    text += _s(max(r.duration for r in timed)) if timed else "not timed (inside mx.compile)"
    waits = [r for r in call if r.wait is not None]
    if waits:
        most = max(waits, key=lambda r: r.wait or 0.0)
        if most.wait:
            on = f" for rank {most.waited_on}" if most.waited_on is not None else ""
            text += f", rank {most.rank} waited {_s(most.wait)}{on}"
    return text + ("" if all(r.ok for r in call) else " (failed)")


def summarize(records: Iterable[OpRecord], slowest: int = 5, noticeable: float = 0.2) -> Summary:
    """Wait and time per rank; the straggler: the rank whose lateness made the others wait most
    (in each collective the rank that waited least made the others wait the difference), named
    when that is at least ``noticeable`` of the time the others spent in ops."""
    records = list(records)
    ranks = sorted({r.rank for r in records})
    wait = {k: 0.0 for k in ranks}
    busy = {k: 0.0 for k in ranks}
    for r in records:
        wait[r.rank] += r.wait or 0.0
        busy[r.rank] += r.duration
    caused = {k: 0.0 for k in ranks}
    grouped = calls(records)
    for call in grouped:
        measured = [r for r in call if r.wait is not None]
        if len(measured) < 2 or call[0].op in P2P:
            continue
        late = min(measured, key=lambda r: r.wait or 0.0)
        caused[late.rank] += sum((r.wait or 0.0) - (late.wait or 0.0) for r in measured)
    straggler = None
    if ranks and len(ranks) > 1:
        worst = max(ranks, key=lambda k: caused[k])
        others = sum(busy[k] for k in ranks if k != worst) or 1e-12
        if caused[worst] / others >= noticeable:
            straggler = worst
    longest = sorted((c for c in grouped if any(r.timed for r in c)),
                     key=lambda c: -max(r.duration for r in c))[:slowest]
    lines = [f"{len(records)} op records on {len(ranks)} rank{'s' if len(ranks) != 1 else ''}"]
    mlx = [r for r in records if r.library == MLX]
    if mlx:
        untimed = sum(1 for r in mlx if not r.timed)
        lines[0] += f" ({len(records) - len(mlx)} of mlx_jupyter's, {len(mlx)} of MLX's own mx.distributed)"
        lines.append("MLX's calls were timed by evaluating each where it was called (under --profile only): "
                     "their time includes waiting for peers" + (f"; {untimed} inside mx.compile could not be "
                                                                 "timed" if untimed else ""))
    lines.append("time in ops, and waiting on peers, per rank:")
    for k in ranks:
        share = f" ({100 * wait[k] / busy[k]:.0f}%)" if busy[k] else ""
        lines.append(f"  rank {k}: {_s(busy[k])} in ops, {_s(wait[k])} waiting{share}")
    if straggler is not None:
        lines.append(f"straggler: rank {straggler} (the others waited {_s(caused[straggler])} for it)")
    elif len(ranks) > 1:
        lines.append("straggler: none (no rank kept the others waiting noticeably)")
    if longest:
        lines.append("slowest ops:")
        lines += [f"  {describe_call(c)}" for c in longest]
    return Summary(len(records), ranks, wait, busy, straggler, caused, longest, "\n".join(lines))


_COLOURS = {"all_sum": "#4c78a8", "all_max": "#72b7b2", "all_min": "#54a24b", "all_gather": "#f58518",
            "sum_scatter": "#b279a2", "send": "#e45756", "recv": "#ff9da6", "barrier": "#9d755d",
            "split": "#bab0ac", "init": "#bab0ac"}
_WAIT = "#d0d0d0"
#: the outline of MLX's own calls' bars
_MLX_EDGE = "#1f1f1f"
#: the timeline's own background and text (it is an image: the theme does not reach it)
_PAPER, _INK = "#ffffff", "#1f1f1f"


def timeline_svg(records: Iterable[OpRecord], width: int = 900, row: int = 26) -> str:
    """One row per rank, one bar per op over time (ops closer than a pixel merged into one bar);
    the grey start of a bar is the op's waiting, drawn first since it is mostly the wait for
    the last peer to arrive. Each bar's ``<title>`` tells the op."""
    records = sorted(records, key=lambda r: (r.rank, r.start))
    ranks = sorted({r.rank for r in records})
    left, top, right = 64, 24, 40  # room for the last time label, centred on the axis's end
    height = top + row * max(1, len(ranks)) + 40
    # a light card of its own: shown as an image, it cannot follow the notebook's theme, and on a dark
    # one a transparent picture's dark text would be unreadable
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" fill="{_INK}">',
             '<title>mlx_jupyter profile: each rank\'s ops over time</title>',
             f'<rect width="{width}" height="{height}" rx="4" fill="{_PAPER}"/>']
    if not records:
        parts.append(f'<text x="{left}" y="{top + 14}">no ops recorded</text></svg>')
        return "\n".join(parts)
    t0 = min(r.start for r in records)
    span = max(max(r.end for r in records) - t0, 1e-9)
    scale = (width - left - right) / span

    def x(t: float) -> float:
        return left + (t - t0) * scale

    for i, k in enumerate(ranks):
        y = top + i * row
        parts.append(f'<text x="4" y="{y + row * 0.6:.1f}">rank {k}</text>')
        mine = [r for r in records if r.rank == k]
        for burst in _bursts(mine, 1.0 / scale):
            a, b = x(burst[0].start), max(x(max(r.end for r in burst)), x(burst[0].start) + 0.5)
            waited = sum(r.wait or 0.0 for r in burst)
            w = min(b - a, waited * scale)
            colour = _COLOURS.get(burst[0].op, "#888888")
            edge = f' stroke="{_MLX_EDGE}" stroke-width="1"' if any(r.library == MLX for r in burst) else ""
            title = describe_call(burst) if len(burst) == 1 else (
                f"{len(burst)} ops ({', '.join(sorted({r.op for r in burst}))}), waited {_s(waited)}")
            parts.append(f'<g><title>{escape(title)}</title>'
                         f'<rect x="{a:.2f}" y="{y + 3}" width="{b - a:.2f}" height="{row - 8}" fill="{colour}"{edge}/>'
                         + (f'<rect x="{a:.2f}" y="{y + 3}" width="{w:.2f}" height="{row - 8}" fill="{_WAIT}"/>'
                            if w > 0.2 else "") + '</g>')
    axis = top + row * len(ranks) + 4
    parts.append(f'<line x1="{left}" y1="{axis}" x2="{width - right}" y2="{axis}" stroke="#444"/>')
    for t, label in axis_ticks(span):
        parts.append(f'<line x1="{x(t0 + t):.1f}" y1="{axis}" x2="{x(t0 + t):.1f}" y2="{axis + 4}" stroke="#444"/>'
                     f'<text x="{x(t0 + t):.1f}" y="{axis + 16}" text-anchor="middle">{escape(label)}</text>')
    legend = sorted({r.op for r in records})
    lx = left
    for op in legend + ["waiting"]:
        colour = _WAIT if op == "waiting" else _COLOURS.get(op, "#888888")
        parts.append(f'<rect x="{lx}" y="{axis + 22}" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{lx + 14}" y="{axis + 31}">{escape(op)}</text>')
        lx += 24 + 7 * len(op)
    if any(r.library == MLX for r in records):
        parts.append(f'<rect x="{lx}" y="{axis + 22}" width="10" height="10" fill="{_PAPER}" stroke="{_MLX_EDGE}"/>'
                     f'<text x="{lx + 14}" y="{axis + 31}">outlined: MLX\'s own mx.distributed</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def axis_ticks(span: float, most: int = 7) -> list[tuple[float, str]]:
    """Round times from 0 to ``span`` s for the axis, a step of 1, 2 or 5 times a power of ten (at most
    ``most`` ticks), each labelled in the unit that suits the span: ``0``, ``100 ms``, ``1.5 s``."""
    step = 10.0 ** math.floor(math.log10(max(span, 1e-9) / most))
    for m in (1, 2, 5, 10):
        if span / (step * m) <= most - 1:
            step *= m
            break
    unit, scale = ("s", 1.0) if span >= 1 else ("ms", 1e3) if span >= 1e-3 else ("µs", 1e6)
    digits = max(0, -math.floor(math.log10(step * scale) + 1e-9))
    out = []
    for i in range(int(span / step + 1e-9) + 1):
        t = i * step
        out.append((t, "0" if i == 0 else f"{t * scale:.{digits}f} {unit}"))
    return out


def _bursts(records: list[OpRecord], pixel: float) -> list[list[OpRecord]]:
    """Consecutive ops of one rank, merged while each starts within a pixel of the last one's end."""
    out: list[list[OpRecord]] = []
    for r in records:
        if out and r.start - max(p.end for p in out[-1][-1:]) < pixel and len(out[-1]) < 100000:
            out[-1].append(r)
        else:
            out.append([r])
    return out
