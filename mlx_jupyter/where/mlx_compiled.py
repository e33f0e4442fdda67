"""MLX's compiled functions in the record of MLX's collectives (:mod:`.mlx_calls`).

``mx.compile`` calls a function's Python once per input signature, to trace it; later calls run the
traced graph, and the collectives in it never pass through the record's wrappers. So a compiled
training step (MLX's own example: ``nn.average_gradients`` inside ``mx.compile``) left the record
blind: its calls were not counted, an agreed stop found no boundary in it, and a drain could not
make the calls a blocked peer waited in. Here ``mx.compile`` is wrapped: the calls recorded while a
compiled function traces are its template, per input signature, and each later call of the
compiled function adds them to the record again (new numbers, the caller's line), before it runs:
the record says what the traced graph does. An agreed stop stops before a compiled call whose
collectives would pass the agreed number.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Any, Callable, Optional

#: one call of a template: (key, op, (dtype, shape), peer, via, nbytes)
Step = tuple[str, str, tuple[Any, Any], Optional[int], Optional[str], int]

#: what ``via`` names for a call a compiled function's graph makes
VIA = "mlx.core.compile"


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What MLX keys a compiled function's traces by, as far as the record needs it: the arrays' dtypes and
    shapes (other arguments by type)."""
    return tuple((a.dtype, a.shape) if hasattr(a, "shape") and hasattr(a, "dtype") else type(a)
                 for a in (*args, *kwargs.values()))


def _template(record: Any, last: Any) -> Optional[list[Step]]:
    """The calls the record got since its newest call was ``last`` (a trace's), oldest first; None when the
    record no longer holds all of them."""
    new = []
    for call in reversed(record.calls):
        if call is last:
            break
        key, _seq, op, x, peer, _code, _lasti, via, _out = call
        dtype, shape = x if isinstance(x, tuple) else (x.dtype, x.shape)
        nbytes = int(getattr(dtype, "size", 0)) * int(math.prod(shape or ()))
        new.append((key, op, (dtype, tuple(shape or ())), peer, via or VIA, nbytes))
    else:
        if last is not None or len(new) == record.calls.maxlen:   # the trace's first calls may be gone already
            return None
    new.reverse()
    return new


class Counted:
    """``mx.compile(fun)``, adding the calls of its traced graph to the record at every call. Callable like
    MLX's compiled function, and like it no method when set on a class (no ``__get__``)."""

    def __init__(self, compiled: Callable[..., Any], fun: Callable[..., Any], record_of: Callable[[], Any]) -> None:
        functools.update_wrapper(self, fun)
        self.compiled, self.record_of = compiled, record_of
        self.templates: dict[tuple[Any, ...], Optional[list[Step]]] = {}   # input signature -> its trace's calls
        self.collects = False   # some trace made a collective (else no call looks its signature up)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841  (IPython shows MLX's error, not this frame)
        record = self.record_of()
        if record is None:
            return self.compiled(*args, **kwargs)
        calls, templates = record.calls, self.templates
        last = calls[-1] if calls else None
        steps = templates.get(_signature(args, kwargs)) if self.collects else None
        if steps and record.stop_after is not None:   # an agreed stop: not past the last number any rank made
            record.stop_at(steps[0][0])
        out = self.compiled(*args, **kwargs)
        try:
            if calls and calls[-1] is not last:   # it traced now: the calls it made are recorded, and its template
                steps = templates[_signature(args, kwargs)] = _template(record, last)
                self.collects = self.collects or steps != []
            elif steps:
                frame = sys._getframe(1)
                for key, op, x, peer, via, nbytes in steps:
                    record.nbytes += nbytes
                    calls.append((key, record.next_number(key), op, x, peer, frame.f_code, frame.f_lasti, via, None))
        except Exception:  # the record never changes what the call does
            pass
        return out


def wrap_compile(compile_fn: Callable[..., Any], record_of: Callable[[], Any]) -> Callable[..., Any]:
    """MLX's ``mx.compile``, whose functions report their collectives to the record (:class:`Counted`)."""

    @functools.wraps(compile_fn)
    def compile(fun: Callable[..., Any], inputs: Any = None, outputs: Any = None, shapeless: bool = False) -> Any:
        compiled = compile_fn(fun, inputs=inputs, outputs=outputs, shapeless=shapeless)
        return Counted(compiled, fun, record_of)

    return compile
