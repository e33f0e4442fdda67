"""MLX's own collectives in a profile (``%%mlx_distributed --profile``): each call of the profiled cell with its op,
group, bytes, dtype, shape, call site, start and duration, per rank, beside our core's records.

MLX is lazy: ``mx.distributed.all_sum(x)`` only builds the op, and the rank blocks wherever the result is evaluated
later. So, under a profile only, each of MLX's collectives (``all_sum``, ``all_gather``, ``all_max``, ``all_min``,
``sum_scatter``) and point-to-point op (``send``, ``recv``, ``recv_like``: recorded as ``send`` and ``recv``, with
the peer) evaluates its input first and then its output right where it is called, timed from the call to the
end of that evaluation: the duration is the op's own, waiting for its peers included (work MLX would have
overlapped with it runs before or after it instead). Outside a profile nothing is evaluated early (the record of
:mod:`mlx_jupyter.where.mlx_calls` only notes the calls). Inside ``mx.compile`` (or ``vmap``) tracing nothing can be
evaluated, and MLX refuses to evaluate a traced input: such a call is recorded without a duration. A call made by
``mlx_jupyter.distributed`` on an MLX-backend group is that group's record already
(:mod:`mlx_jupyter.collective.call_tracker`): it is not recorded twice.

:func:`start` and :func:`stop` are what a cluster's ranks run for a profiled cell: the core's recording
(:mod:`mlx_jupyter.collective.recording`) and this one together. The timing stops by itself after the profiled
cell (a profile whose records were never gathered evaluates nothing early in later cells).
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Optional

from mlx_jupyter.collective import recording
from mlx_jupyter.collective.profile import MLX, OpRecord
from mlx_jupyter.where import mlx_calls
from mlx_jupyter.where.call_site import line_of

if TYPE_CHECKING:
    from mlx_jupyter.where.records import Fn, Timed

#: the module of `MlxGroup`, whose calls into MLX are its own records
OURS = "mlx_jupyter.collective.group"
#: the group ids of MLX's groups in a profile: ``mx:world``, ``mx:world/1``
PREFIX = "mx:"

_lock = threading.Lock()
#: this profile's calls: (key, seq, op, nbytes, dtype, shape, code, lasti, via, start_ns, end_ns or None, ok, peer)
_calls: deque[Timed] = deque(maxlen=recording.DEFAULT_CAPACITY)
#: (owner, name, the recording wrapper, the profiling one) while a profile times MLX's calls
_swapped: list[tuple[Any, str, Fn, Fn]] = []
#: the last cell number timed (the profiled cell: the record's number at start, plus one)
_until = 0


def start(capacity: int = recording.DEFAULT_CAPACITY) -> None:
    """Record every op of our core and time every MLX collective of this process (a new profile)."""
    global _calls, _until
    recording.start(capacity)
    with _lock:
        _restore()
        _calls = deque(maxlen=int(capacity))
        record = mlx_calls.RECORD
        if record is None:   # MLX is not imported here: our core's ops only
            return
        _until = record.cell + 1   # the cell that comes next is the profiled one
        for owner, name, original, wrapped in mlx_calls._SWAPS:
            if name in mlx_calls.COLLECTIVE_OPS + mlx_calls.P2P_OPS and getattr(owner, name, None) is wrapped:
                timed = _timed(wrapped, name) if name in mlx_calls.COLLECTIVE_OPS else _timed_p2p(wrapped, name)
                setattr(owner, name, timed)
                _swapped.append((owner, name, wrapped, timed))


def stop() -> list[OpRecord]:
    """Stop; every record of this profile, our core's and MLX's, ordered by start time."""
    records = recording.stop()
    with _lock:
        _restore()
        taken = list(_calls)
        _calls.clear()
    return sorted(records + records_of(taken, recording.to_epoch()), key=lambda r: (r.start, r.rank))


def _restore() -> None:
    for owner, name, wrapped, timed in _swapped:
        if getattr(owner, name, None) is timed:
            setattr(owner, name, wrapped)
    _swapped.clear()


def _timed(recorded: Fn, op: str) -> Fn:
    """MLX's collective (``recorded``: its recording wrapper) timed."""
    import mlx.core as mx

    from mlx_jupyter import _core

    clock, evaluate, getframe = _core.clock_ns, mx.eval, sys._getframe

    def call(x: Any, *, group: Any = None, stream: Any = None) -> Any:
        __tracebackhide__ = True  # noqa: F841  (IPython shows MLX's error, not this frame)
        record = mlx_calls.RECORD
        frame = getframe(1)
        if record is None or record.cell > _until or frame.f_globals.get("__name__") == OURS:
            return recorded(x, group=group, stream=stream)   # after the profiled cell; an MlxGroup's own call
        try:
            evaluate(x)
            timed = True
        except Exception:   # a traced input (mx.compile, vmap): nothing is evaluated here
            timed = False
        begin = clock()
        out = recorded(x, group=group, stream=stream)
        ok = False
        try:
            if timed:
                evaluate(out)
            ok = True
        finally:
            _note(record, op, x, out, frame, begin, clock() if timed else None, ok)
        return out
    return mlx_calls._named(call, recorded)


#: what MLX says when a traced array (mx.compile, vmap) is evaluated
TRACED = "function transformations"


def _timed_p2p(recorded: Fn, name: str) -> Fn:
    """MLX's ``send``, ``recv`` or ``recv_like`` (``recorded``: its recording wrapper) timed, as :func:`_timed`: the
    input (``send``'s array, ``recv_like``'s template) evaluated first, the op timed to the end of its output's
    evaluation. ``recv`` has no input to tell a trace by: a traced output is left to be evaluated later, untimed."""
    import mlx.core as mx

    from mlx_jupyter import _core

    clock, evaluate, getframe = _core.clock_ns, mx.eval, sys._getframe
    op = "send" if name == "send" else "recv"   # the record's name of recv_like is recv

    def call(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841  (IPython shows MLX's error, not this frame)
        record = mlx_calls.RECORD
        frame = getframe(1)
        if record is None or record.cell > _until or frame.f_globals.get("__name__") == OURS:
            return recorded(*args, **kwargs)
        x = args[0] if name != "recv" and args else None
        timed = True
        if x is not None:
            try:
                evaluate(x)
            except Exception:   # a traced input: nothing is evaluated here
                timed = False
        begin = clock()
        out = recorded(*args, **kwargs)
        ok = False
        try:
            if timed:
                try:
                    evaluate(out)
                except ValueError as exc:
                    if name != "recv" or TRACED not in str(exc):
                        raise
                    timed = False   # recv inside mx.compile: evaluated later, where MLX runs the graph
            ok = True
        finally:
            _note(record, op, x if op == "send" else out, out, frame, begin, clock() if timed else None, ok)
        return out
    return mlx_calls._named(call, recorded)


def _note(record: Any, op: str, x: Any, out: Any, frame: Any, begin: int, end: Optional[int], ok: bool) -> None:
    """The call just recorded (the record's newest, which the recording wrapper placed in this module's frame), placed
    at ``frame``, the caller's (the first outside MLX's Python code, naming the MLX function it went through), and
    its time."""
    try:
        c = record.calls[-1]
        kept = c[8]
        if c[2] != op or not (kept is out or (callable(kept) and kept() is out)):
            return   # the record missed it
        via = None
        while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("mlx."):
            via = via or f"{frame.f_globals['__name__']}.{frame.f_code.co_name}"   # mlx.nn.average_gradients
            frame = frame.f_back
        code, lasti = (frame.f_code, frame.f_lasti) if frame is not None else (None, -1)
        record.calls[-1] = (*c[:5], code, lasti, via, kept)   # the where table's call site too
        _calls.append((c[0], c[1], op, int(x.nbytes), str(x.dtype).replace("mlx.core.", ""), tuple(x.shape),
                       code, lasti, via, begin, end, ok, c[4]))
    except Exception:  # the profile never changes what the call does
        pass


def records_of(taken: list[Timed], offset: float, cell_files: tuple[str, ...] = ()) -> list[OpRecord]:
    """The calls as `OpRecord`s (times in seconds since the epoch: the core's clock + ``offset``), on this
    process's rank in MLX's world."""
    record = mlx_calls.RECORD
    groups = dict(record.groups) if record is not None else {}
    me = groups.get(mlx_calls.WORLD, (0, 1))[0]
    out = []
    for key, seq, op, nbytes, dtype, shape, code, lasti, via, begin, end, ok, peer in taken:
        label = key.split(":", 1)[0]   # a send's or recv's key names its ends too: world:0>1
        at = mlx_calls.site(code, line_of(code, lasti), cell_files)
        if via:
            at += f" via {via}"
        t0 = begin * 1e-9 + offset
        out.append(OpRecord(PREFIX + label, me, groups.get(label, (0, 1))[1], op, seq, nbytes, dtype, t0,
                            t0 if end is None else end * 1e-9 + offset, None, peer, ok,
                            library=MLX, shape=shape, at=at, timed=end is not None))
    return out
