"""One sample of where a rank is: the running thread's stack, our core's activity, CPU and memory.

Taken from any thread (the rank's sampler, a control request, a signal-waiting thread): it
reads ``sys._current_frames()`` and the activity snapshot, and holds no lock the sampled
thread could hold. The result is a small JSON-able dict (sent a few times a second).
"""

from __future__ import annotations

import linecache
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Optional, TypedDict

from mlx_jupyter.collective import pause
from mlx_jupyter.where import mlx_calls, mlx_evaluated, mlx_evaluating, mlx_memory

if TYPE_CHECKING:
    from types import FrameType

    from mlx_jupyter.collective.activity import OpActivity

try:
    from mlx_jupyter.collective.activity import snapshot
except ImportError:  # the native activity record is not built into this core yet
    def snapshot() -> list[OpActivity]:
        return []

#: modules whose calls are shown by name (the innermost such call is the one the rank is in)
NAMED = (("mlx_jupyter.distributed", "dist"), ("mlx_jupyter.collective", "core"), ("mlx.", "mx"), ("mlx", "mx"),
         ("numpy", "np"), ("torch", "torch"))
#: the most frames of the stack looked at
MAX_DEPTH = 200



class DebuggerAt(TypedDict):
    """The pdb prompt a rank waits at: the frame's line and function, and whether it is a post-mortem."""

    line: int
    func: str
    post_mortem: bool


class MlxTotals(TypedDict):
    """MLX's collectives since the rank recorded them: the calls per group label, their inputs' bytes."""

    calls: dict[str, int]
    bytes: int


#: the pdb session this process is stopped in, waiting for a line (set by the rank's debugger)
_debugger: Optional[DebuggerAt] = None


def set_debugger(frame: Any = None, post_mortem: bool = False) -> None:
    """This process waits at a pdb prompt in ``frame`` (None: it does not any more)."""
    global _debugger
    _debugger = None if frame is None else {
        "line": frame.f_lineno, "func": frame.f_code.co_name, "post_mortem": post_mortem}
    pause.set_paused(frame is not None)  # peers' collectives waiting on us do not time out meanwhile


def _named(module: str) -> Optional[str]:
    for prefix, short in NAMED:
        if module == prefix or module.startswith(prefix if prefix.endswith(".") else prefix + "."):
            return short
    return None


_is_cell = mlx_calls.is_cell


def stack_where(frame: Any, cell_files: tuple[str, ...] = ()) -> dict[str, Any]:
    """The cell's (or script's) innermost frame and the library call it is in, from ``frame`` outwards.

    ``{"line": N, "file": F, "source": S, "call": "mx.eval" | None, "func": innermost function}``.
    """
    frames: list[FrameType] = []
    while frame is not None and len(frames) < MAX_DEPTH:
        frames.append(frame)
        frame = frame.f_back
    out: dict[str, Any] = {"line": None, "file": None, "source": None, "call": None, "func": None}
    if frames:
        out["func"] = frames[0].f_code.co_name
    cell_at = None
    in_pdb = False
    for i, f in enumerate(frames):
        # a plain pdb (a launched script's) waits in Pdb.interaction; its frame's line is the cell's below
        in_pdb = in_pdb or (f.f_code.co_name == "interaction" and f.f_globals.get("__name__") == "pdb")
        if _is_cell(f.f_code.co_filename, cell_files):
            cell_at = i
            if in_pdb:
                out["debugger"] = {"line": f.f_lineno, "func": f.f_code.co_name, "post_mortem": False}
            out.update(line=f.f_lineno, file=f.f_code.co_filename,
                       source=linecache.getline(f.f_code.co_filename, f.f_lineno, f.f_globals).strip()[:120])
            break
    # the outermost named call inside the cell's frame: `dist.all_sum`, not its helpers
    inner = frames[:cell_at] if cell_at is not None else frames
    for f in reversed(inner):
        short = _named(str(f.f_globals.get("__name__", "")))
        if short is not None:
            out["call"] = f"{short}.{f.f_code.co_name}"
            break
    if out["call"] is None and cell_at is not None and out["source"]:
        out["call"] = _call_in_source(out["source"])
    return out


def _call_in_source(source: str) -> Optional[str]:
    """A call into MLX written on the cell's line (``mx.eval(...)``): MLX's functions are native, no frame."""
    for marker in ("mx.distributed.", "mx.eval", "mx.", "np."):
        at = source.find(marker)
        if at >= 0:
            return source[at:].split("(", 1)[0]
    return None


def _safe_evaluating(frame: Any) -> Optional[str]:
    try:
        return mlx_evaluating.evaluating(frame)
    except Exception:  # a sampler never fails the rank
        return None


def _safe_evaluated(frame: Any, text: str) -> Optional[list[str | int]]:
    """``[key, seq]`` of the recorded call the evaluation at ``frame`` evaluates (None: not told)."""
    try:
        found = mlx_evaluated.evaluated(frame, text, list(mlx_calls.RECORD.calls))  # type: ignore[union-attr]
    except Exception:  # a sampler never fails the rank
        return None
    return list(found) if found is not None else None


class _Still:
    """How long a thread has been at the same instruction of the same frame, having made no MLX call
    meanwhile (a native call blocks there; a loop passing the same line again has made calls)."""

    def __init__(self) -> None:
        self._at: dict[Optional[int], tuple[int, int, int, float]] = {}   # thread id -> (frame, lasti, calls, since)

    def seconds(self, tid: Optional[int], frame: Any, calls: int = 0) -> float:
        key = (id(frame), frame.f_lasti, calls)
        now = time.monotonic()
        last = self._at.get(tid)
        if last is None or last[:3] != key:
            self._at[tid] = (*key, now)
            return 0.0
        return round(now - last[3], 2)


_STILL = _Still()


class CpuMeter:
    """This process's CPU use between two readings, in percent of one core."""

    def __init__(self) -> None:
        self._last = (time.monotonic(), time.process_time())

    def percent(self) -> float:
        now = (time.monotonic(), time.process_time())
        wall, cpu = now[0] - self._last[0], now[1] - self._last[1]
        self._last = now
        return round(100.0 * cpu / wall, 1) if wall > 0 else 0.0


def activity() -> list[dict[str, Any]]:
    """Our core's (and MLX-backend groups') activity, as dicts; [] when the core has no record."""
    out: list[dict[str, Any]] = []
    try:
        for a in snapshot():
            out.append({"group": str(a.group_id), "rank": int(a.rank), "size": int(a.size), "state": str(a.state),
                        "op": a.op, "seq": int(a.seq), "nbytes": int(a.nbytes), "dtype": str(a.dtype),
                        "elapsed": round(float(a.elapsed), 3), "waiting_on": a.waiting_on, "moved": int(a.moved),
                        "backend": str(getattr(a, "backend", "")), "timeout": getattr(a, "timeout", None)})
    except Exception:  # a sampler never fails the rank
        return []
    return out


def counters() -> list[list[str | int]]:
    """Each live group's collectives so far and its last op's size, ``[group, seq, nbytes]``, idle
    or not (the dashboard's ops and bytes per second come from their change between two samples)."""
    try:
        return [[str(a.group_id), int(a.seq), int(a.nbytes)] for a in snapshot()]
    except Exception:  # a sampler never fails the rank
        return []


def mlx_counters() -> Optional[MlxTotals]:
    """MLX's own collectives since the rank recorded them (:mod:`mlx_jupyter.where.mlx_calls`): ``{"calls": {group
    label: calls}, "bytes": their inputs' bytes}``, totals that never restart (None: MLX's calls are not recorded)."""
    record = mlx_calls.RECORD
    if record is None:
        return None
    try:
        return {"calls": record.totals(), "bytes": int(record.nbytes)}
    except Exception:  # a sampler never fails the rank
        return None


def take(thread_id: Optional[int], rank: int, cpu: Optional[CpuMeter] = None, rss: int = 0,
         cell_files: tuple[str, ...] = (), running: bool = True) -> dict[str, Any]:
    """A sample of rank ``rank``, whose code runs on thread ``thread_id`` (None: the main thread)."""
    tid = threading.main_thread().ident if thread_id is None else thread_id
    frame = sys._current_frames().get(tid) if running and tid is not None else None
    try:
        where = stack_where(frame, cell_files) if frame is not None else {}
        if frame is not None and mlx_calls.RECORD is not None:
            where["mlx"] = mlx_calls.snapshot(cell_files)
            where["mlx_eval"] = _safe_evaluating(frame)
            if where["mlx_eval"]:
                where["mlx_evaluates"] = _safe_evaluated(frame, where["mlx_eval"])
            where["still"] = _STILL.seconds(tid, frame, mlx_calls.RECORD.made())
        elif mlx_calls.RECORD is not None and any(mlx_calls.RECORD.counts.values()):
            where["mlx"] = mlx_calls.snapshot(cell_files)   # an idle rank's last cell's calls: its peers may wait in one
    finally:
        del frame
    out = {"rank": rank, "pid": os.getpid(), "running": running, "time": time.time(), **where,
           "activity": activity() if running else [], "cpu": cpu.percent() if cpu else None, "rss": rss,
           "ops": counters(), "mlx_ops": mlx_counters(), "mlx_memory": mlx_memory.read()}
    debugger = _debugger
    if running and debugger is not None:
        out["debugger"] = debugger  # the debugger's own word: the frame it shows, a post-mortem's too
    return out
