"""Which recorded MLX collective a rank's evaluating call evaluates, read when a sample is taken.

MLX is lazy: the rank blocks in the collective it evaluates, which need not be its newest call
(``a = all_sum(x); b = all_sum(y); print(a)``). The evaluating expression names it: it holds the
call itself (``mx.eval(mx.distributed.all_sum(x))``), or a name a statement bound to its result
(``y = all_sum(x)`` ... ``print(y)``; the newest such call, as in a loop). Nothing here runs per call.
"""

from __future__ import annotations

import ast
import linecache
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Optional, Sequence

if TYPE_CHECKING:
    from mlx_jupyter.where.records import Made


def evaluated(frame: Any, text: str, calls: Sequence[Made]) -> Optional[tuple[str, int]]:
    """``(key, seq)`` of the call in ``calls`` (:class:`~.mlx_calls.Record` tuples) that ``frame``'s
    evaluating expression ``text`` evaluates; None when it cannot be told."""
    span = _position(frame.f_code, frame.f_lasti)
    if span is None:
        return None
    try:
        names = {n.id for n in ast.walk(ast.parse(text.strip(), mode="eval")) if isinstance(n, ast.Name)}
    except SyntaxError:
        names = set()
    filename = frame.f_code.co_filename
    for call in reversed(list(calls)):
        key, seq, code, lasti = call[0], call[1], call[5], call[6]   # (key, seq, op, x, peer, code, lasti, ...)
        if code is None or code.co_filename != filename:
            continue
        at = _position(code, lasti)
        if at is None:
            continue
        if _within(at, span) or names & _bound(filename, at[0], at[2], frame.f_globals):
            return key, seq
    return None


def _position(code: Any, lasti: int) -> Optional[tuple[int, int, int, int]]:
    """(line, end line, column, end column) of instruction ``lasti`` of ``code``."""
    try:
        for i, pos in enumerate(code.co_positions()):
            if i == lasti // 2:
                return None if None in pos else pos
    except Exception:
        pass
    return None


def _within(inner: tuple[int, int, int, int], outer: tuple[int, int, int, int]) -> bool:
    return (inner[0], inner[2]) >= (outer[0], outer[2]) and (inner[1], inner[3]) <= (outer[1], outer[3])


def _bound(filename: str, line: int, col: int, module_globals: Any) -> set[str]:
    """The names the assignment whose value holds the call at ``line``/``col`` binds ({} for none)."""
    source = "".join(linecache.getlines(filename, module_globals))
    return set(_assignments(source).get((line, col), ()))


@lru_cache(maxsize=16)
def _assignments(source: str) -> dict[tuple[int, int], tuple[str, ...]]:
    """(line, column) of each call inside an assignment's value -> the names it assigns."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    out: dict[tuple[int, int], tuple[str, ...]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = tuple(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            for call in ast.walk(node.value):
                if isinstance(call, ast.Call):
                    out[(call.lineno, call.col_offset)] = names
    return out
