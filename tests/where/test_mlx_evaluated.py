"""Which recorded call a rank's evaluation evaluates (``where/mlx_evaluated.py``), from real frames of a cell."""

from __future__ import annotations

import linecache
import sys

import pytest

from mlx_jupyter.where.mlx_evaluating import _call_text
from mlx_jupyter.where.mlx_evaluated import evaluated


def run_cell(source: str) -> list:
    """Run ``source`` as a cell: ``coll(...)`` is recorded as a collective is, ``look(...)`` evaluates; what
    each ``look`` was found to evaluate."""
    name = f"<cell-{abs(hash(source))}>"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    calls: list = []
    seen: list = []

    def coll(n: int) -> object:
        frame = sys._getframe(1)
        calls.append(("world", len(calls) + 1, "all_sum", None, None, frame.f_code, frame.f_lasti, None))
        return object()

    def look(*_: object) -> None:
        frame = sys._getframe(1)
        seen.append(evaluated(frame, _call_text(frame), calls))  # what evaluating() gives for MLX

    exec(compile(source, name, "exec"), {"coll": coll, "look": look})
    return seen


@pytest.mark.parametrize("source, want", [
    ("a = coll(4)\nb = coll(8)\nlook(a)\nlook(b)\n", [("world", 1), ("world", 2)]),   # the op built last, evaluated last
    ("\nif True: y = coll(4)\nelse: y = coll(8)\nlook(y)\n", [("world", 1)]),          # an if's one-line branch
    ("look(coll(1))\n", [("world", 1)]),                                                # built where it is evaluated
    ("for i in range(3):\n    y = coll(i)\nlook(y)\n", [("world", 3)]),               # the newest of a loop
    ("y = coll(1)\nz = 2\nlook(z)\n", [None]),                                          # not one of the calls
])
def test_the_call_evaluated_is_found(source, want):
    assert run_cell(source) == want
