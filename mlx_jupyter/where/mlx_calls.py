"""A rank's record of its calls into MLX's collectives (``mx.distributed``), for the where table.

:func:`install` wraps the functions of ``mlx.core.distributed`` (``all_sum``, ``all_gather``,
``all_max``, ``all_min``, ``sum_scatter``, ``send``, ``recv``, ``recv_like``) and ``init`` and
``Group.split``: each call is passed through unchanged and then noted (op, dtype, shape, group,
peer, call site, sequence number). MLX is lazy: a call only builds the collective; the rank blocks
where it is evaluated, which :mod:`mlx_jupyter.where.mlx_evaluating` tells from the main thread's
stack. Sequence numbers count per group (and per sender and receiver for ``send``/``recv``), from
the start of the cell on a cluster's rank (:func:`new_cell`), from the start of a launched script,
so that the ranks' numbers compare: the rank with fewer calls is the one behind. Beside them the
record keeps totals that never restart (:meth:`Record.totals`, the calls per key since
:func:`install`, and ``Record.nbytes``, their inputs' bytes): the dashboard's rates.
"""

from __future__ import annotations

import itertools
import math
import sys
import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Optional

from mlx_jupyter.where.call_site import is_cell as is_cell, line_of, site as site

if TYPE_CHECKING:
    from mlx_jupyter.where.records import Fn, Made, SentCall, SentRecord

#: collectives every rank of the group makes (one sequence per group)
COLLECTIVE_OPS = ("all_sum", "all_gather", "all_max", "all_min", "sum_scatter")
#: point-to-point ops (one sequence per group, sender and receiver)
P2P_OPS = ("send", "recv", "recv_like")
#: the records kept (the newest): a drain sees the calls a rank is this many behind by, and which of them ran
#: (a tensor-parallel forward makes 2 per layer, and mlx-lm builds the next token while one runs)
KEEP = 32
#: the newest records sent in a sample (the where table's)
SENT = 8
#: an input of at most this many bytes is kept whole in the record, its dtype and shape read only when a
#: sample is taken (reading them costs more than the rest of the record); a larger one's are read at once,
#: so that the record never holds more than 2 * KEEP * HOLD_BYTES of arrays alive (inputs and outputs)
HOLD_BYTES = 1 << 20
#: the longest a call waits for an agreed stop's last number (then it stops there)
STOP_WAIT = 2.0
#: the label of the global group (``group=None`` and what ``init`` returns)
WORLD = "world"


class Record:
    """What this rank called into MLX's collectives since the cell began.

    Each call is one tuple ``(key, seq, op, x, peer, code, lasti, via, out)``: ``x`` is the input array (small
    ones) or its ``(dtype, shape)``, ``code``/``lasti`` the caller's code object and instruction (its line
    is found only when a sample is taken), ``out`` a collective's output (a large one by weak reference:
    whether it ran tells a drain what this rank did). Each key counts with an ``itertools.count`` (one C call)."""

    def __init__(self) -> None:
        self.counters: dict[str, Any] = {}               # key -> itertools.count of its next number
        #: (the calls per key of the cells before this one, this cell's counters): replaced whole by new_cell, so
        #: that another thread reads both of one moment (totals never go down)
        self.tally: tuple[dict[str, int], dict[str, Any]] = ({}, self.counters)
        #: the bytes of every call's input since install (one addition per call; never reset)
        self.nbytes = 0
        self.groups: dict[str, tuple[int, int]] = {}   # label -> (this rank's rank in it, its size)
        self.calls: deque[Made] = deque(maxlen=KEEP)
        self.labels: dict[int, tuple[Any, str]] = {}    # id(group) -> (group, label): keeps the group alive
        self.world: tuple[str, Callable[[], int]] = self._counted(WORLD)   # group=None: (label, next number)
        self.last_group: Any = None                      # the group of the last call, and its (label, next)
        self.last: tuple[str, Callable[[], int]] = self.world
        self.user_code: Any = None                       # the code of the last caller outside MLX
        self.cell = 0
        #: an agreed stop (:mod:`mlx_jupyter.cluster.drain`): label -> the last call number any rank had made;
        #: the next call waits for it (at most STOP_WAIT s) until ``stop_known`` is set
        self.stop_after: Optional[dict[str, int]] = None
        self.stop_known = threading.Event()

    def _counted(self, key: str) -> tuple[str, Callable[[], int]]:
        counter = self.counters.get(key)
        if counter is None:
            counter = self.counters[key] = itertools.count(1)
        return key, counter.__next__

    def next_number(self, key: str) -> int:
        """The next call number of ``key`` (a call made outside the wrappers: a compiled graph's)."""
        return int(self._counted(key)[1]())

    @property
    def counts(self) -> dict[str, int]:
        """The calls made per key since the cell began."""
        return {k: _made(c) for k, c in list(self.counters.items())}

    def totals(self) -> dict[str, int]:
        """The calls made per key since :func:`install`: they survive :meth:`new_cell` (any thread)."""
        before, counters = self.tally
        out = dict(before)
        for k, c in list(counters.items()):
            out[k] = out.get(k, 0) + _made(c)
        return out

    def label(self, group: Any) -> str:
        if group is None:
            return WORLD
        known = self.labels.get(id(group))
        if known is not None and known[0] is group:
            return known[1]
        same_size = _size(group) == self.groups.get(WORLD, (0, -1))[1]
        return self.name(group, WORLD if same_size else f"group{len(self.labels)}")

    def name(self, group: Any, label: str) -> str:
        if len(self.labels) > 1024:  # a loop making groups: forget the oldest
            self.labels.pop(next(iter(self.labels)))
        self.labels[id(group)] = (group, label)
        try:
            self.groups[label] = (int(group.rank()), int(group.size()))
        except Exception:
            pass
        self._counted(label)
        if group is self.last_group:
            self.last_group = None
        return label

    def relabel(self, group: Any) -> tuple[str, Callable[[], int]]:
        """``group``'s label and counter, remembered as the last call's (found by identity next time)."""
        self.last = self._counted(self.label(group))
        self.last_group = group
        return self.last

    def collective(self, op: str, x: Any, group: Any, frame: Any) -> None:
        """A collective of ``group`` on ``x``, called from ``frame`` (the wrappers inline this)."""
        label, count = self.world if group is None else (self.last if group is self.last_group else self.relabel(group))
        seq = count()
        self.nbytes += x.nbytes
        if frame.f_code is not self.user_code and self.from_mlx_code(frame):
            self._from_mlx(label, seq, op, held(x), None, frame)
            return
        self.calls.append((label, seq, op, held(x), None, frame.f_code, frame.f_lasti, None, None))

    def from_mlx_code(self, frame: Any) -> bool:
        """Whether ``frame`` runs MLX's own Python code (else its code is remembered as the user's)."""
        if str(frame.f_globals.get("__name__", "")).startswith("mlx."):
            return True
        self.user_code = frame.f_code
        return False

    def stop_here(self, group: Any) -> None:
        """Raise KeyboardInterrupt if the next call on ``group`` is past the agreed stop's last one (wait
        for that number while the notebook gathers it)."""
        self.stop_at(self.label(group))

    def stop_at(self, label: str) -> None:
        """:meth:`stop_here` for the group (or send/recv pair) ``label``."""
        if not self.stop_known.wait(STOP_WAIT):
            raise KeyboardInterrupt("stopped at a collective boundary (the agreed last call did not come)")
        label = label.partition(":")[0]   # a send/recv pair's key: its group's
        last = (self.stop_after or {}).get(label)
        counter = self.counters.get(label)
        if last is not None and counter is not None and _made(counter) >= last:
            raise KeyboardInterrupt(f"stopped at a collective boundary: after MLX call #{last} on `{label}`, "
                                    "the last any rank had made")

    def add(self, op: str, x: Any, group: Any, peer: int, frame: Any, nbytes: int = 0, out: Any = None) -> None:
        """A point-to-point op with its peer in ``group``'s numbers; ``x``: the array or ``(dtype, shape)``;
        ``out``: its output (held as a collective's: whether it ran tells a drain what this rank did)."""
        self.nbytes += nbytes
        label = WORLD if group is None else (self.last[0] if group is self.last_group else self.relabel(group)[0])
        me = self.groups.get(label, (0, 0))[0]
        key = f"{label}:{me}>{peer}" if op == "send" else f"{label}:{peer}>{me}"
        self._from_mlx(key, self._counted(key)[1](), op, x, peer, frame, _held_out(out))

    def _from_mlx(self, key: str, seq: int, op: str, x: Any, peer: Optional[int], frame: Any, out: Any = None) -> None:
        """Noted at the first frame outside MLX's Python code, naming the MLX function it went through."""
        via = None
        while frame is not None and str(frame.f_globals.get("__name__", "")).startswith("mlx."):
            via = via or f"{frame.f_globals['__name__']}.{frame.f_code.co_name}"   # mlx.nn.average_gradients
            frame = frame.f_back
        code, lasti = (frame.f_code, frame.f_lasti) if frame is not None else (None, -1)
        self.calls.append((key, seq, op, x, peer, code, lasti, via, out))

    def made(self) -> int:
        """The calls made since the cell began (changes whenever a call is made)."""
        return sum(self.counts.values())

    def new_cell(self) -> None:
        """The numbers start again (a cell of a cluster: every rank starts it); held inputs are let go."""
        before = self.totals()
        self.counters = {k: itertools.count(1) for k in self.counters if ":" not in k}
        self.tally = (before, self.counters)
        self.world = self._counted(WORLD)
        self.last_group, self.last = None, self.world
        self.calls.clear()
        self.stop_after = None
        self.stop_known.set()
        self.cell += 1

    def snapshot(self, cell_files: tuple[str, ...] = ()) -> SentRecord:
        """The record as JSON-able data (any thread): counts, groups and the newest calls."""
        calls = list(self.calls)[-SENT:]
        return {"counts": self.counts, "groups": {k: list(v) for k, v in self.groups.items()},
                "calls": [_call_dict(c, cell_files) for c in calls]}


def _made(counter: Any) -> int:
    """How many numbers ``counter`` (``itertools.count(1)``) gave: read from its repr, which never advances it."""
    return int(repr(counter)[6:-1]) - 1


def held(x: Any) -> Any:
    """What the record keeps of input ``x``: ``x`` itself when small, else its ``(dtype, shape)``."""
    return x if x.nbytes <= HOLD_BYTES else (x.dtype, x.shape)


def _held_out(out: Any) -> Any:
    """A point-to-point op's output as the record keeps it: small ones whole, large ones by weak reference."""
    try:
        return out if out is None or out.nbytes <= HOLD_BYTES else weakref.ref(out)
    except Exception:
        return None


def _size(group: Any) -> int:
    try:
        return int(group.size())
    except Exception:
        return -1


def _call_dict(c: Made, cell_files: tuple[str, ...]) -> SentCall:
    key, seq, op, x, peer, code, lasti, via, _out = c
    dtype, shape = x if isinstance(x, tuple) else (x.dtype, x.shape)
    line = line_of(code, lasti)
    return {"key": key, "seq": seq, "op": op, "dtype": str(dtype).replace("mlx.core.", ""),
            "shape": list(shape) if shape is not None else None, "peer": peer,
            "at": site(code, line, cell_files), "via": via}


#: this process's record (None until :func:`install`)
RECORD: Optional[Record] = None
_lock = threading.Lock()


def _wrap_collective(fn: Fn, op: str) -> Fn:
    getframe = sys._getframe
    hold = HOLD_BYTES

    # MLX's signature spelled out: forwarding *args and **kwargs costs more than the whole record
    def call(x: Any, *, group: Any = None, stream: Any = None) -> Any:
        __tracebackhide__ = True  # noqa: F841  (IPython shows MLX's error, not this frame)
        record: Record = RECORD  # type: ignore[assignment]  # install set it before it wrapped anything
        if record.stop_after is not None:  # an agreed stop: no call past the last one any rank made
            record.stop_here(group)
        out = fn(x, group=group, stream=stream)
        try:  # Record.collective, inlined: this runs on every call
            if group is None:
                label, count = record.world
            elif group is record.last_group:
                label, count = record.last
            else:
                label, count = record.relabel(group)
            seq = count()
            frame = getframe(1)
            code = frame.f_code
            nbytes = x.nbytes
            record.nbytes += nbytes
            if nbytes <= hold:   # a small input and output are held; a large output by weak reference
                x_held, out_held = x, out
            else:
                x_held, out_held = (x.dtype, x.shape), weakref.ref(out)
            if code is not record.user_code and record.from_mlx_code(frame):
                record._from_mlx(label, seq, op, x_held, None, frame, out_held)
            else:
                record.calls.append((label, seq, op, x_held, None, code, frame.f_lasti, None, out_held))
        except Exception:  # the record never changes what the call does
            pass
        return out
    return _named(call, fn)


def _wrap_send(fn: Fn) -> Fn:
    def send(x: Any, dst: int, *, group: Any = None, stream: Any = None) -> Any:
        __tracebackhide__ = True  # noqa: F841  (IPython shows MLX's error, not this frame)
        out = fn(x, dst, group=group, stream=stream)
        try:
            RECORD.add("send", held(x), group, int(dst), sys._getframe(1), x.nbytes, out)  # type: ignore[union-attr]
        except Exception:
            pass
        return out
    return _named(send, fn)


def _wrap_recv(fn: Fn) -> Fn:
    def recv(shape: Any, dtype: Any, src: int, *, group: Any = None, stream: Any = None) -> Any:
        __tracebackhide__ = True  # noqa: F841  (IPython shows MLX's error, not this frame)
        out = fn(shape, dtype, src, group=group, stream=stream)
        try:
            nbytes = dtype.size * math.prod(shape)
            RECORD.add("recv", (dtype, tuple(shape)), group, int(src), sys._getframe(1), nbytes, out)  # type: ignore[union-attr]
        except Exception:
            pass
        return out
    return _named(recv, fn)


def _wrap_recv_like(fn: Fn) -> Fn:
    def recv_like(x: Any, src: int, *, group: Any = None, stream: Any = None) -> Any:
        __tracebackhide__ = True  # noqa: F841  (IPython shows MLX's error, not this frame)
        out = fn(x, src, group=group, stream=stream)
        try:
            RECORD.add("recv", held(x), group, int(src), sys._getframe(1), x.nbytes, out)  # type: ignore[union-attr]
        except Exception:
            pass
        return out
    return _named(recv_like, fn)


def _wrap_init(fn: Fn) -> Fn:
    def init(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841  (IPython shows MLX's error, not this frame)
        group = fn(*args, **kwargs)
        try:
            RECORD.name(group, WORLD)  # type: ignore[union-attr]
        except Exception:
            pass
        return group
    return _named(init, fn)


def _wrap_split(fn: Fn) -> Fn:
    def split(self: Any, color: int, key: int = -1) -> Any:
        __tracebackhide__ = True  # noqa: F841  (IPython shows MLX's error, not this frame)
        group = fn(self, color, key)
        try:
            record = RECORD
            record.name(group, f"{record.label(self)}/{color}")  # type: ignore[union-attr]
        except Exception:
            pass
        return group
    return _named(split, fn)


def _named(wrapper: Fn, fn: Fn) -> Fn:
    wrapper.__name__ = getattr(fn, "__name__", wrapper.__name__)
    wrapper.__qualname__ = wrapper.__name__
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    wrapper.__module__ = "mlx.core.distributed"   # what the where table and the world guard look for
    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def install(world: Any = None) -> Optional[Record]:
    """Wrap ``mlx.core.distributed``'s functions once (None: MLX is not importable here); ``world``:
    the global group, when it was formed before."""
    global RECORD
    with _lock:
        if RECORD is not None:
            if world is not None:
                RECORD.name(world, WORLD)
            return RECORD
        try:
            import mlx.core as mx
        except Exception:
            return None
        import functools

        dist = mx.distributed
        RECORD = Record()
        wraps: list[tuple[str, Callable[[Fn], Fn]]] = [
            (op, functools.partial(_wrap_collective, op=op)) for op in COLLECTIVE_OPS]
        wraps += [("send", _wrap_send), ("recv", _wrap_recv), ("recv_like", _wrap_recv_like), ("init", _wrap_init)]
        for op, wrap in wraps:
            if hasattr(dist, op):
                _SWAPS.append((dist, op, getattr(dist, op), wrap(getattr(dist, op))))
        from mlx_jupyter.where.mlx_compiled import wrap_compile

        _SWAPS.append((mx, "compile", mx.compile, wrap_compile(mx.compile, lambda: RECORD)))
        try:
            _SWAPS.append((dist.Group, "split", dist.Group.split, _wrap_split(dist.Group.split)))
        except Exception:  # a Group whose methods cannot be replaced: splits count as groups of their size
            pass
        enable(True)
        if world is not None:
            RECORD.name(world, WORLD)
        return RECORD


#: (owner, name, MLX's function, ours) for every function wrapped
_SWAPS: list[tuple[Any, str, Fn, Fn]] = []


def enable(on: bool) -> None:
    """Record (True) or call MLX's functions directly (False: for measuring what the record costs)."""
    for owner, name, original, wrapped in _SWAPS:
        try:
            setattr(owner, name, wrapped if on else original)
        except Exception:
            pass


def install_when_imported() -> None:
    """Install as soon as ``mlx.core`` is imported (a launched script imports it itself)."""
    if "mlx.core" in sys.modules:
        install()
        return
    sys.meta_path.insert(0, _Finder())


class _Finder:
    """Finds nothing itself: wraps the real loader of ``mlx.core`` to install the record after it ran."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "mlx.core":
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def run(module: Any) -> None:
            exec_module(module)
            install()
        loader.exec_module = run  # type: ignore[method-assign]
        return spec


def new_cell() -> None:
    """A cell begins on a cluster's rank: count again from 1."""
    if RECORD is not None:
        RECORD.new_cell()


def snapshot(cell_files: tuple[str, ...] = ()) -> Optional[SentRecord]:
    """The record (None when not installed), for a sample."""
    record = RECORD
    if record is None:
        return None
    try:
        return record.snapshot(cell_files)
    except Exception:  # a deque changed size while read: the next sample has it
        return None
