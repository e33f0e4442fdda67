"""Where a recorded MLX call was made, in words: ``line 3`` of a cell, ``model.py:12 in step`` elsewhere."""

from __future__ import annotations

from types import CodeType
from typing import Any, Optional


def line_of(code: Optional[CodeType], lasti: int) -> Optional[int]:
    """The line of instruction ``lasti`` of ``code``."""
    if code is None:
        return None
    for start, end, line in code.co_lines():
        if start <= lasti < end:
            return line
    return code.co_firstlineno


def is_cell(filename: str, cell_files: tuple[str, ...] = ()) -> bool:
    """A cell's code (IPython compiles each cell to a file of its own), or the launched script."""
    return filename.startswith("<ipython-input-") or "/ipykernel_" in filename or filename in cell_files


def site(code: Any, line: Optional[int], cell_files: tuple[str, ...] = ()) -> str:
    """``line 3`` (a cell's, or the launched script's), ``model.py:12 in step`` elsewhere."""
    if code is None:
        return "?"
    if is_cell(code.co_filename, cell_files):
        return f"line {line}" + (f" in {code.co_name}" if code.co_name != "<module>" else "")
    name = code.co_filename.rsplit("/", 1)[-1]
    return f"{name}:{line}" + (f" in {code.co_name}" if code.co_name != "<module>" else "")
