"""The activity and profile records of a group whose ops run in MLX (`MlxGroup`), kept in Python
around each call: MLX says nothing of its own progress, so the state is "running" (never
"waiting") and a record's wait is None."""

from __future__ import annotations

import math
from collections import deque
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator, Optional

import numpy as np

from mlx_jupyter import _core
from mlx_jupyter.collective import arrays, recording
from mlx_jupyter.collective.activity import OpActivity
from mlx_jupyter.collective.profile import OpRecord


class CallTracker:
    """The calls of ``group`` (anything with group_id, rank(), size(), backend, aborted)."""

    def __init__(self, group: Any, capacity: int = recording.DEFAULT_CAPACITY) -> None:
        self.group = group
        # the call in progress, (op, seq, nbytes, dtype, start_ns), replaced whole: snapshot() reads it unlocked
        self.current: Optional[tuple[str, int, int, str, int]] = None
        self.last: tuple[str, int, int, str] = ("", 0, 0, "")
        self.seq = 0
        self.records: "deque[OpRecord]" = deque(maxlen=capacity)

    @contextmanager
    def op(self, name: str, x: Any = None) -> Iterator[None]:
        """Around one MLX call: ``name`` ("all_sum", ...) on ``x`` (its bytes and dtype)."""
        v = None if x is None else arrays.view(x)
        nbytes = 0 if v is None else math.prod(v.shape) * np.dtype("uint16" if v.dtype == "bfloat16" else v.dtype).itemsize
        self.seq += 1
        start = _core.clock_ns()
        self.current = (name, self.seq, nbytes, "" if v is None else v.dtype, start)
        ok = False
        try:
            yield
            ok = True
        finally:
            self.last, self.current = self.current[:4], None
            if recording.recording():
                g = self.group
                self.records.append(OpRecord(g.group_id, g.rank(), g.size(), name, self.last[1], nbytes, self.last[3],
                                             start * 1e-9, _core.clock_ns() * 1e-9, None, None, ok))

    def activity(self) -> OpActivity:
        g, cur = self.group, self.current
        if cur is None:
            op, seq, nbytes, dtype = self.last
            return OpActivity(g.group_id, g.rank(), g.size(), "idle", None, seq, nbytes, dtype, 0.0, None, 0,
                              g.backend, g.aborted)
        op, seq, nbytes, dtype, start = cur
        return OpActivity(g.group_id, g.rank(), g.size(), "running", op, seq, nbytes, dtype,
                          (_core.clock_ns() - start) * 1e-9, None, 0, g.backend, g.aborted)

    def take(self, offset: float) -> list[OpRecord]:
        """The records so far (times + ``offset``), emptied."""
        out = []
        while self.records:
            r = self.records.popleft()
            out.append(replace(r, start=r.start + offset, end=r.end + offset))
        return out
