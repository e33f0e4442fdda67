"""The agent's hook at a cell's clean end, for the per-cell state record (opt-in): empty unless
:mod:`.state_record` is on, so that a cell's end costs one test when it is off. Imports nothing,
so that the agent does not import the record's machinery (nor the record the agent)."""

from __future__ import annotations

from typing import Any, Callable, Optional

#: called with the cell's number after each cell that ended cleanly (set by state_record.enable)
RECORD: Optional[Callable[[int], None]] = None


def cell_number(shell: Any, result: Any) -> int:
    """The number of the cell ending now: the notebook's (``In[7]``) when it sent one, else the rank's."""
    count = getattr(getattr(shell, "compile", None), "_mlxj_count", 0)
    return count or getattr(result, "execution_count", None) or getattr(shell, "execution_count", 0) or 1
